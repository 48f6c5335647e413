"""Fixtures shared by all tests: the local Slurm cluster, and a path that breaks bad quoting."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

pytest_plugins = ["pytester"]

# Every shell metacharacter a run directory could smuggle into a script, as submitit's tests
# do. No newline: Slurm's --chdir cannot take one.
WEIRD_NAME = "we ird'dir\"$(touch PWNED)`touch TICK`;echo hi"


def pytest_configure(config: pytest.Config) -> None:
    """HPCDP_TEST_CPU_LOG=FILE: each test's CPU into FILE (tests/cpu_log.py; not where this
    conftest was copied without it, as test_cluster.py's pytester run does)."""
    here = Path(__file__).parent
    if os.environ.get("HPCDP_TEST_CPU_LOG") and (here / "cpu_log.py").is_file():
        import importlib.util

        spec = importlib.util.spec_from_file_location("cpu_log", here / "cpu_log.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config.pluginmanager.register(module, "cpu_log")


@pytest.fixture(scope="session", autouse=True)
def private_job_records(tmp_path_factory) -> Iterator[None]:
    """Jobs the tests submit are recorded in a private folder, not in the user's
    ~/.local/state/hpcdp (what `hpcdp status` shows them)."""
    os.environ["HPCDP_STATE_DIR"] = str(tmp_path_factory.mktemp("hpcdp-state"))
    yield


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The local Slurm cluster (started when it is not up); yields its directory.

    SLURM_CONF is exported for the whole session so that sbatch/srun/sacct find it. The cluster
    is left running at the end on purpose: the next test run (and other developers' runs)
    reuse it, which takes 0.1 s instead of a cold start. Stop it with `hpcdp cluster down`.
    """
    from hpcdp import cluster

    result = cluster.run_script("up")
    if result.returncode == cluster.CANNOT_START:
        pytest.skip(f"local Slurm cluster cannot start here: {result.last_line}")
    if result.returncode != 0:
        pytest.fail(f"`{cluster.SCRIPT} up` failed ({result.returncode}): {result.last_line}")
    os.environ.update(cluster.slurm_env())
    yield cluster.cluster_dir()


# zero1 is left out: bench/forecast_held_out.py runs all four, tests/unit/test_forecast.py
# checks its serial broadcast, and its four cells were 90 s of the suite's 25 minutes.
CAMPAIGN_STRATEGIES = ["distributed-ps", "horovod", "fsdp"]


@pytest.fixture(scope="session")
def two_node_campaign(slurm_cluster, tmp_path_factory) -> dict:
    """One `hpcdp compare` campaign, shared by test_compare.py and test_forecast_held_out.py
    (one campaign instead of two keeps the suite under its 25 minutes): DDP, Horovod (where
    installed) and fsdp on 1 and 2 nodes, 2 ranks per node (so that a 1-node cell does its
    strategy's own communication: the forecast's held-out check), micro-batch 4 (each node's
    work per step as with 1 rank at the smoke experiment's 8), 2 repeats of 10 steps,
    with its network probes on 1 and 2 nodes. {"job_id", "folder", "strategies",
    "has_horovod", "partition"}.

    It runs on the gpu partition's two nodes (its CPUs; no GPU is asked for), so that
    scripts/test.sh runs it beside the debug partition's tests: the tests that read it are
    marked gpu_partition (pytest_collection_modifyitems). Where the cluster has no gpu
    partition it runs in debug, queued among the other Slurm tests' jobs."""
    import re
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("campaign")
    from horovod_probe import horovod_importable
    from slurm_jobs import beside_partition

    has_horovod = horovod_importable()
    strategies = [s for s in CAMPAIGN_STRATEGIES if has_horovod or s != "horovod"]
    partition = beside_partition()
    settings = [f"matrix.strategies=[{','.join(strategies)}]", "matrix.nodes=[1,2]",
                "train.steps=10", "train.eval_interval=0", "train.checkpoint_interval=0",
                "cluster.cpu_ranks_per_node=2", "train.micro_batch_size=4",
                f"cluster.partition={partition}"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcdp", "compare", "--out", str(tmp / "runs"), "--repeats", "2",
         *[a for s in settings for a in ("--set", s)], "--wait", "--timeout", "900"],
        cwd=tmp, capture_output=True, text=True, timeout=1000, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    return {"job_id": re.search(r"submitted job (\d+)", done.stdout).group(1),
            "folder": Path(re.search(r"run:\s+(\S.*)", done.stdout).group(1).strip()),
            "strategies": strategies, "has_horovod": has_horovod, "partition": partition}


@pytest.fixture(scope="session")
def requeued_ddp(slurm_cluster, tmp_path_factory) -> dict:
    """Two `hpcdp submit` jobs of DDP on 2 nodes (slurm_jobs.REQUEUED_DDP_SETTINGS): one
    straight, and one with the three trackers that pauses at step 4 until Slurm's time-limit
    signal (USR2) stops it, then is requeued and resumes. Shared by test_resume_every_strategy
    (the resumed losses equal the straight ones), test_tracked_runs (each tracker holds every
    step once) and test_preemption (the reference of its preempted job): two jobs instead of
    four. {"straight": dir, "stopped": dir, "infos": {"straight"|"stopped": slurm.JobInfo}}."""
    import subprocess

    from slurm_jobs import (
        REQUEUED_DDP_PAUSE,
        REQUEUED_DDP_SETTINGS,
        TRACKERS,
        sets,
        submit,
        wait_all,
        wait_for_step,
    )

    tmp = tmp_path_factory.mktemp("requeued-ddp")
    straight = submit(tmp, "distributed-ps", 2, tmp / "straight", *REQUEUED_DDP_SETTINGS)
    stopped = submit(tmp, "distributed-ps", 2, tmp / "stopped", *REQUEUED_DDP_SETTINGS,
                     *sets(TRACKERS), env={"HPCDP_FAULT": f"pause@{REQUEUED_DDP_PAUSE}"})
    wait_for_step(stopped[1], REQUEUED_DDP_PAUSE)
    # What Slurm sends the batch shell before the time limit (--signal=B:USR2@...).
    subprocess.run(["scancel", "--batch", "--signal=USR2", stopped[0]], check=True)
    infos = wait_all([straight[0], stopped[0]], timeout_s=600)
    return {"straight": straight[1], "stopped": stopped[1],
            "infos": {"straight": infos[straight[0]], "stopped": infos[stopped[0]]}}


LOCAL_DDP_STEPS = 14


@pytest.fixture(scope="session")
def local_ddp_run(tmp_path_factory) -> dict:
    """`hpcdp run -s distributed-ps --ranks 2`: 14 steps on synthetic data, every step logged,
    started inside what looks like an allocation (SLURM_* set, which `hpcdp run` must ignore).
    Shared by test_local_run.py, test_comm_measured.py and test_resume_elsewhere.py, which only
    read it: one 2-rank run instead of three. {"run_dir", "stdout", "steps"}."""
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("local-ddp")
    env = {**os.environ, "SLURM_JOB_ID": "999", "SLURM_PROCID": "3", "SLURM_NTASKS": "8"}
    settings = ["data.corpus=synthetic", f"train.steps={LOCAL_DDP_STEPS}",
                "train.eval_interval=0", "train.checkpoint_interval=0", "train.log_interval=1"]
    done = subprocess.run(
        [sys.executable, "-m", "hpcdp", "run", "--strategy", "distributed-ps", "--ranks", "2",
         "--out", str(tmp / "runs"), *[a for s in settings for a in ("--set", s)]],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {"run_dir": tmp / "runs" / "smoke" / "distributed-ps-1n", "stdout": done.stdout,
            "steps": LOCAL_DDP_STEPS}


LOCAL_HOROVOD_SETTINGS = ["train.steps=6", "train.checkpoint_interval=6", "train.eval_interval=6",
                          "data.corpus=synthetic", "train.log_interval=1"]


@pytest.fixture(scope="session")
def local_horovod_run(tmp_path_factory) -> dict:
    """`hpcdp run -s horovod --ranks 2` twice into one folder (LOCAL_HOROVOD_SETTINGS: a
    checkpoint and an evaluation at step 6): the second run resumes from the first one's last
    checkpoint and has nothing to do. Shared by test_local_run.py (the resume must not
    deadlock) and test_export.py (Horovod's checkpoint exported): one run pair instead of two.
    {"run_dir", "outputs": [stdout of each run]}; skips where Horovod is not installed."""
    import subprocess
    import sys

    from horovod_probe import SKIP_REASON, horovod_importable

    if not horovod_importable():
        pytest.skip(SKIP_REASON)
    tmp = tmp_path_factory.mktemp("local-horovod")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    command = [sys.executable, "-m", "hpcdp", "run", "--strategy", "horovod", "--ranks", "2",
               "--out", str(tmp / "runs"), *[a for s in LOCAL_HOROVOD_SETTINGS
                                             for a in ("--set", s)]]
    outputs = []
    for _ in range(2):
        done = subprocess.run(command, cwd=tmp, env=env | {"OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs.append(done.stdout)
    return {"run_dir": tmp / "runs" / "smoke" / "horovod-1n", "outputs": outputs}


@pytest.fixture
def matches_golden():
    """check(text, path, regenerate): `text` equals the golden file at `path`, or the test
    fails with the diff and the command that regenerates it (HPCDP_REGENERATE_GOLDEN=1 writes
    it first)."""
    import difflib

    def check(text: str, path: Path, regenerate: str) -> None:
        if os.environ.get("HPCDP_REGENERATE_GOLDEN"):
            path.write_text(text)
        expected = path.read_text()
        if text != expected:
            diff = "".join(difflib.unified_diff(expected.splitlines(True),
                                                text.splitlines(True), str(path), "rendered"))
            pytest.fail(f"rendered script differs from {path}:\n{diff}\nIf the change is "
                        f"intended, regenerate with: {regenerate}")

    return check


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A fresh directory whose name holds a space, quotes, $(...), a backtick, ';' and echo."""
    path = tmp_path / WEIRD_NAME
    path.mkdir()
    return path


# Modules whose tests without Slurm scripts/test.sh runs in a pytest process of their own,
# beside the other tests without Slurm and the Slurm tests: about half of the local tests' time
# (measured per module), and none shares a session fixture with a module outside the set (a
# session fixture is made once per process).
SECOND_LOCAL_STREAM = {"test_train_strategies.py", "test_train_resume.py",
                       "test_checkpoint_damage.py", "test_smoke_settings.py",
                       "test_accumulation_comm.py", "test_corpora_train.py",
                       "test_train_metrics.py", "test_train_cli.py", "test_horovod_install.py",
                       "test_harvest_real.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs the cluster is marked `slurm`, whether or not its module says so:
    scripts/test.sh runs the `slurm` tests and the others as separate pytest processes at once
    (and those of SECOND_LOCAL_STREAM in a third)."""
    for item in items:
        if "slurm_cluster" in item.fixturenames:
            item.add_marker(pytest.mark.slurm)
        if "two_node_campaign" in item.fixturenames:  # it runs on the gpu partition's nodes
            item.add_marker(pytest.mark.gpu_partition)
        if item.path.name in SECOND_LOCAL_STREAM:
            item.add_marker(pytest.mark.second_local_stream)


# Tests that failed while a cluster daemon died under them, and were run once more.
RERUN_AFTER_A_DAEMON_DIED: list[tuple[str, list[str]]] = []


def _heal_cluster() -> None:
    """`up` restarts dead daemons and resumes the nodes Slurm set DOWN meanwhile."""
    from hpcdp import cluster

    result = cluster.run_script("up")
    if result.returncode != 0:
        pytest.exit(f"the local cluster lost a daemon and `up` failed: {result.last_line}", 3)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test that needs the cluster starts on a whole one, and runs once more if it failed
    while one of the cluster's daemons died.

    Why: Debian's slurmd 22.05.8 has aborted under concurrent step launches ("malloc():
    unaligned tcache chunk detected" in nodelist_find; one CI run, 2026-12-01). Its node went
    DOWN, and every later test that needed that node failed too. A crash of Slurm itself is not
    a failure of hpcdp, so the test gets a second run on a healed cluster; the rerun is named
    in the summary, and a test that fails twice fails.
    """
    from hpcdp import cluster

    if "slurm_cluster" not in item.fixturenames or not cluster.is_up():
        return None  # the normal protocol; the session fixture starts the cluster
    before = cluster.daemon_pids()
    if len(before) < len(list((cluster.cluster_dir() / "run").glob("*.pid"))):
        _heal_cluster()
        before = cluster.daemon_pids()
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    died = sorted(name for name, pid in before.items() if cluster.daemon_pids().get(name) != pid)
    if died and any(report.failed for report in reports):
        RERUN_AFTER_A_DAEMON_DIED.append((item.nodeid, died))
        _heal_cluster()
        item._initrequest()  # fresh function-scoped fixtures (tmp_path) for the second run
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter) -> None:
    for nodeid, died in RERUN_AFTER_A_DAEMON_DIED:
        terminalreporter.write_line(
            f"RERUN {nodeid}: it failed while {', '.join(died)} died; ran again on a healed cluster"
        )
