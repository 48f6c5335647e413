"""The local Slurm cluster that `hpcdp cluster up` starts: real daemons, real jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp import cluster

pytestmark = pytest.mark.slurm

NODES = ["node1", "node2", "node3", "node4"]
# Jobs here take well under a second; the deadlines only bound a hang.
JOB_TIMEOUT_S = 60
# slurmctld sends job records to slurmdbd every ~5 s, so sacct lags squeue.
SACCT_DEADLINE_S = 30


def run(*cmd: str, timeout: float = JOB_TIMEOUT_S, env: dict[str, str] | None = None):
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy()
    )


def sbatch_wait(tmp_path: Path, *args: str) -> tuple[str, int]:
    """Submit a batch job, wait for it to end; return (job id, sbatch's exit code)."""
    result = run(
        "sbatch", "--parsable", "--wait", f"--output={tmp_path}/slurm-%j.out", *args
    )
    job_id = result.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch printed no job id: {result.stdout!r} {result.stderr!r}"
    return job_id, result.returncode


def sacct_final(job_id: str, fields: str) -> str:
    """Plain `sacct -j ID -X -n -o FIELDS`, polled until the job's record is final."""
    deadline = time.monotonic() + SACCT_DEADLINE_S
    line = ""
    while time.monotonic() < deadline:
        line = " ".join(run("sacct", "-j", job_id, "-X", "-n", "-o", fields).stdout.split())
        if line and line.split()[0] not in {"PENDING", "RUNNING", "COMPLETING"}:
            return line
        time.sleep(0.5)
    return line


def test_four_nodes_of_four_cpus_in_partition_debug(slurm_cluster: Path) -> None:
    result = run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %P %t %c")
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [row[0] for row in rows] == NODES
    assert {row[1] for row in rows} == {"debug*"}, "debug must be the default partition"
    # idle, or busy with someone's job; never down, drained or not responding ('*').
    assert {row[2] for row in rows} <= {"idle", "mix", "alloc"}, rows
    assert {row[3] for row in rows} == {"4"}


def test_srun_runs_on_two_named_nodes_that_resolve_each_other(slurm_cluster: Path) -> None:
    result = run(
        "srun", "-N2", "--ntasks-per-node=1", "--nodelist=node1,node2",
        "bash", "-c", 'echo "$(hostname) $(getent hosts node2)"',
    )
    assert result.returncode == 0, result.stderr
    lines = sorted(" ".join(line.split()) for line in result.stdout.splitlines())
    assert lines == ["node1 127.0.100.2 node2", "node2 127.0.100.2 node2"]


def test_two_node_batch_job_is_completed_in_sacct(slurm_cluster: Path, tmp_path: Path) -> None:
    job_id, code = sbatch_wait(tmp_path, "-N2", "--ntasks-per-node=1", "--wrap=srun hostname")
    assert code == 0
    assert sacct_final(job_id, "State") == "COMPLETED"
    hosts = (tmp_path / f"slurm-{job_id}.out").read_text().split()
    assert len(hosts) == 2 and set(hosts) <= set(NODES), hosts


def test_failing_job_is_failed_with_its_exit_code(slurm_cluster: Path, tmp_path: Path) -> None:
    job_id, code = sbatch_wait(tmp_path, "--wrap=exit 3")
    assert code == 3
    # Read from the text output: `sacct --json` reports 0 for plain non-zero exits in 22.05.
    assert sacct_final(job_id, "State,ExitCode") == "FAILED 3:0"


def test_mpi4py_over_pmix_spans_two_nodes(slurm_cluster: Path) -> None:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    program = (
        "import os, socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(c.Get_rank(), c.Get_size(), socket.gethostname(), "
        "os.environ.get('OMPI_ALLOW_RUN_AS_ROOT'), "
        "os.environ.get('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM'))"
    )
    result = run(
        "srun", "--mpi=pmix", "-N2", "-n2", "--ntasks-per-node=1",
        sys.executable, "-c", program, env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [row[:2] for row in rows] == [["0", "2"], ["1", "2"]], result.stdout
    assert len({row[2] for row in rows}) == 2, "the two ranks must run on two nodes"
    assert all(row[3:] == ["1", "1"] for row in rows), "OMPI root variables must reach the ranks"


def test_second_up_is_a_no_op(slurm_cluster: Path) -> None:
    pid_file = slurm_cluster / "run" / "slurmctld.pid"
    pid_before = pid_file.read_text().strip()
    result = cluster.run_script("up")
    assert result.returncode == 0
    assert "already up" in result.output
    assert pid_file.read_text().strip() == pid_before


# Run by a nested pytest with the project's conftest: one test kills node4's slurmd and fails
# the first time (as a Slurm crash under a job would), then needs all four nodes; the other
# fails with every daemon alive and must not get a second run.
DAEMON_DEATH_TESTS = """
import os, signal, subprocess
from pathlib import Path
from hpcdp import cluster

def test_a_daemon_dies_under_it(slurm_cluster, tmp_path_factory):
    marker = Path(os.environ["FIRST_RUN_MARKER"])
    if not marker.exists():
        marker.touch()
        os.kill(cluster.daemon_pids()["slurmd-node4"], signal.SIGKILL)
        raise AssertionError("the jobs of this test failed")
    srun = subprocess.run(["srun", "-N4", "hostname"], capture_output=True, text=True, timeout=60)
    assert srun.returncode == 0, srun.stderr

def test_fails_on_its_own(slurm_cluster):
    raise AssertionError("a real failure")
"""


def test_a_test_that_failed_as_a_daemon_died_runs_again_on_a_healed_cluster(
    slurm_cluster: Path, pytester: pytest.Pytester
) -> None:
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_daemon_death=DAEMON_DEATH_TESTS)
    marker = pytester.path / "first-run"
    os.environ["FIRST_RUN_MARKER"] = str(marker)
    try:
        result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    finally:
        del os.environ["FIRST_RUN_MARKER"]
    assert marker.exists(), result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    rerun = [line for line in result.outlines if line.startswith("RERUN ")]
    assert rerun == [
        "RERUN test_daemon_death.py::test_a_daemon_dies_under_it: it failed while slurmd-node4"
        " died; ran again on a healed cluster"
    ], result.stdout.str()
    assert "slurmd-node4" in cluster.daemon_pids()


def test_python_api_sees_the_running_cluster(slurm_cluster: Path) -> None:
    assert cluster.is_up()
    assert cluster.slurm_env() == {"SLURM_CONF": str(slurm_cluster / "etc" / "slurm.conf")}
    assert cluster.status() == 0
    shell = run("bash", "-c", f'eval "$(bash {cluster.SCRIPT} env)" && echo "$SLURM_CONF"')
    assert shell.stdout.strip() == str(cluster.slurm_conf_path())


def test_is_up_is_false_for_a_directory_without_a_cluster(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HPCDP_CLUSTER_DIR", str(tmp_path))
    assert not cluster.is_up()
    assert cluster.slurm_env() == {}


def test_without_root_it_says_so_and_exits_3(tmp_path: Path) -> None:
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    result = run(
        *(as_nobody if os.geteuid() == 0 else []), "bash", str(cluster.SCRIPT), "up",
        env={"PATH": os.environ["PATH"], "HPCDP_CLUSTER_DIR": str(tmp_path / "c")},
    )
    assert result.returncode == cluster.CANNOT_START
    assert "needs root" in result.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the root check answers first")
def test_missing_commands_are_named_with_the_install_line(tmp_path: Path) -> None:
    # An empty PATH: every daemon is "missing"; bash itself is started by its full path.
    result = run(
        "/bin/bash", str(cluster.SCRIPT), "up",
        env={"PATH": str(tmp_path), "HPCDP_CLUSTER_DIR": str(tmp_path / "c")},
    )
    assert result.returncode == cluster.CANNOT_START
    assert result.stderr.count("\n") == 1, result.stderr
    assert "missing munged slurmctld slurmd slurmdbd mariadbd" in result.stderr
    assert "apt-get install slurm-wlm slurmdbd munge mariadb-server" in result.stderr
