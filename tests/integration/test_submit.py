"""The generator and submission against the real local Slurm cluster (no mocked sbatch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import wait_all

from hpcdp import config, slurm

pytestmark = pytest.mark.slurm

# A few steps of the tiny model: enough to exercise the whole path, seconds per job.
FAST = ["--set", "train.steps=4", "--set", "train.eval_interval=0",
        "--set", "train.checkpoint_interval=0"]


def hpcdp(*args: str, cwd: Path, check: bool = True, timeout: float = 600):
    result = subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"hpcdp {' '.join(args)} -> {result.returncode}\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def squeue_ids() -> set[str]:
    # The debug partition's: the gpu partition's tests may run at the same time (scripts/test.sh).
    out = subprocess.run(["squeue", "-h", "-p", "debug", "-o", "%i"], capture_output=True,
                         text=True, check=True)
    return set(out.stdout.split())


def wait_final(job_id: str, timeout_s: float = 300) -> slurm.JobInfo:
    return wait_all([job_id], timeout_s)[job_id]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_paper_cell_passes_bash_n_and_sbatch_test_only(slurm_cluster, tmp_path):
    out = tmp_path / "runs"
    result = hpcdp("render", "--experiment", "paper", "--cluster", "local", "--out", str(out),
                   cwd=tmp_path)
    scripts = [Path(p) for p in result.stdout.split()]
    assert len(scripts) == len(config.load_experiment("paper").matrix.cells()) == 14
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
        test = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True,
                              text=True)
        assert test.returncode == 0, (script, test.stderr)
        assert "to start at" in test.stderr


def test_dry_run_submits_and_writes_nothing(slurm_cluster, tmp_path):
    before = squeue_ids()
    result = hpcdp("submit", "--dry-run", "--strategy", "ddp", "--nodes", "2",
                   "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert "#SBATCH --nodes=2" in result.stdout and "would submit" in result.stdout
    assert not squeue_ids() - before  # nothing new (an earlier test's job may end meanwhile)
    assert not (tmp_path / "runs").exists()


def test_rendered_script_runs_by_hand_with_sbatch_on_two_nodes(slurm_cluster, tmp_path):
    """Rendered, then sbatch'ed by hand: DDP on two nodes completes.

    The same job carries `network_interface: '^docker0,lo'` (NCCL's syntax, the form
    troubleshooting.md recommends), which once rendered GLOO_SOCKET_IFNAME='^docker0,lo' that
    Gloo cannot read: CPU DDP broke. Now each node resolves it to an interface Gloo can use
    (on the local cluster, each node's hsn0). Where the machine has no interface but lo, the
    job runs without it."""
    from hpcdp import distenv

    exclusion = [name for name in distenv.local_interfaces() if not name.startswith("lo")]
    interface = ["--set", "cluster.network_interface=^docker0,lo"] if exclusion else []
    result = hpcdp("render", "--strategy", "distributed-ps", "--nodes", "2",
                   "--out", str(tmp_path / "runs"), *FAST, *interface, cwd=tmp_path)
    script = Path(result.stdout.strip())
    sbatch = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                            text=True, check=True, cwd=tmp_path)
    job_id = sbatch.stdout.strip().split(";")[0]
    info = wait_final(job_id)
    log = (script.parent / f"slurm-{job_id}.out")
    assert info.state == "COMPLETED", log.read_text()[-3000:] if log.exists() else info
    assert info.num_nodes == 2
    records = metrics(script.parent)
    header = records[0]
    assert header["kind"] == "header" and header["world_size"] == 2 and header["nodes"] == 2
    assert header["slurm_job_id"] == job_id and header["communication"] == "gloo"
    assert records[-1]["kind"] == "summary"
    if exclusion:
        text = script.read_text()
        assert "GLOO_SOCKET_IFNAME" not in text and "NCCL_SOCKET_IFNAME='^docker0,lo'" in text


def link_bytes() -> dict[str, int]:
    """Bytes each local-cluster node sent over its link (its bridge end's rx), by node."""
    return {path.name[len("hpv-"):]: int((path / "statistics" / "rx_bytes").read_text())
            for path in Path("/sys/class/net").glob("hpv-*")}


def test_hpcdp_submit_wait_completes_on_two_nodes(slurm_cluster, tmp_path):
    """Also (issue 45): every rank's Gloo traffic goes through its node's interface, not lo,
    and each node's link carries at least one gradient per step."""
    from hpcdp import cluster

    before = link_bytes()
    result = hpcdp("submit", "--strategy", "distributed-ps", "--nodes", "2", "--wait",
                   "--out", str(tmp_path / "runs"), *FAST, cwd=tmp_path)
    after = link_bytes()
    assert "COMPLETED" in result.stdout
    state_file = Path(os.environ["HPCDP_STATE_DIR"]) / "jobs.jsonl"
    record = json.loads(state_file.read_text().splitlines()[-1])
    run_dir = Path(record["run_dir"])
    assert run_dir.parent.parent == tmp_path / "runs"
    # submitit sent exactly the rendered script
    submitted = sorted((run_dir / ".submitit").rglob("*submission*"))
    assert submitted and submitted[0].read_text() == (run_dir / "job.sbatch").read_text()
    header = metrics(run_dir)[0]
    assert header["world_size"] == 2
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "ranks").glob("rank-*.json"))]
    assert len({r["node"] for r in ranks}) == 2, ranks
    if cluster.network_mode() == "namespaces":
        assert [r["gloo_interface"] for r in ranks] == ["hsn0", "hsn0"], ranks
        # A 2-rank ring all-reduce sends each rank's whole gradient once (half in the
        # reduce-scatter, half in the all-gather), every step; other jobs only add bytes.
        for r in ranks:
            sent = after[r["node"]] - before.get(r["node"], 0)
            assert sent >= 4 * header["grad_bytes_per_step"], (r["node"], sent)
    rows = json.loads(hpcdp("status", "--json", cwd=tmp_path).stdout)
    assert rows[-1]["job_id"] == record["job_id"] and rows[-1]["state"] == "COMPLETED"


def test_submit_wait_exits_nonzero_when_the_job_fails(slurm_cluster, tmp_path):
    # A corpus that exists but is not a list of strings makes `python -m train prepare` fail
    # inside the job (one that does not exist is refused before submitting).
    (tmp_path / "bad.json").write_text('{"not": "a list of strings"}')
    result = hpcdp("submit", "--strategy", "single-gpu", "--wait", "--out", str(tmp_path / "r"),
                   "--set", f"data.corpus={tmp_path}/bad.json", *FAST, cwd=tmp_path,
                   check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED" in result.stdout


def test_weird_paths_render_inert(slurm_cluster, weird_tmp_path):
    """A run directory full of shell metacharacters: the job completes, no payload runs."""
    out = weird_tmp_path / "runs"
    result = hpcdp("render", "--strategy", "single-gpu", "--out", str(out), *FAST,
                   cwd=weird_tmp_path)
    script = Path(result.stdout.strip())
    assert script.exists()
    sbatch = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                            text=True, check=True, cwd=weird_tmp_path)
    info = wait_final(sbatch.stdout.strip())
    assert info.state == "COMPLETED"
    assert (script.parent / "metrics.jsonl").exists()
    # The payloads would create PWNED / TICK in whatever directory the shell ran in.
    for base in (weird_tmp_path.parent, Path(slurm_cluster), Path.home(), Path("/")):
        for payload in ("PWNED", "TICK"):
            assert not (base / payload).exists(), f"{base / payload} was created"
    assert not list(weird_tmp_path.parent.rglob("PWNED"))


def test_a_master_that_is_not_rank0s_node_fails_fast(slurm_cluster, tmp_path):
    """MASTER_ADDR forced to the second node: rank 0 (on node1) stops at once, naming both,
    instead of every rank waiting out the rendezvous timeout. The job asks for node1 and node2
    by name, so the test does not depend on which nodes Slurm would pick."""
    result = hpcdp("submit", "--strategy", "distributed-ps", "--nodes", "2", "--wait",
                   "--out", str(tmp_path / "runs"), "--set", "cluster.env={MASTER_ADDR: node2}",
                   "--set", "cluster.extra_sbatch=['--nodelist=node1,node2']",
                   "--set", "train.dist_timeout_s=600", *FAST, cwd=tmp_path, check=False)
    assert result.returncode == 1 and "FAILED" in result.stdout
    log = next((tmp_path / "runs" / "smoke" / "distributed-ps-2n").glob("slurm-*.out"))
    text = log.read_text()
    assert "rank 0 runs on 'node1' but MASTER_ADDR is 'node2'" in text, text[-2000:]


def test_status_asks_slurm_once_for_all_jobs(slurm_cluster, tmp_path):
    """Three jobs, one `hpcdp status`: one squeue and at most one sacct call. The real commands
    answer; wrappers first on PATH only count the calls. The jobs are held (PENDING), so none
    of them trains: only their rows are needed."""
    job_ids = []
    for i in range(3):
        submitted = hpcdp("submit", "--strategy", "single-gpu", "--out", str(tmp_path / f"runs{i}"),
                          *FAST, "--set", "cluster.extra_sbatch=['--hold']", cwd=tmp_path)
        job_ids.append(submitted.stdout.split("submitted job ")[1].split(":")[0])
    try:
        _status_counts_calls(tmp_path)
    finally:
        subprocess.run(["scancel", *job_ids], check=True)


def _status_counts_calls(tmp_path: Path) -> None:
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("squeue", "sacct"):
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        (shims / tool).write_text(f'#!/bin/sh\necho {tool} >> "{calls}"\nexec {real} "$@"\n')
        (shims / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "hpcdp", "status", "--json"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) >= 3 and all(r["state"] == "PENDING" for r in rows[-3:]), rows
    made = calls.read_text().split()
    assert made.count("squeue") == 1 and made.count("sacct") <= 1, made


def test_submit_wait_ends_where_sacct_is_unavailable(slurm_cluster, tmp_path):
    """A cluster without accounting: --wait follows squeue and stops when the job leaves it
    (state UNKNOWN, exit 1: success cannot be confirmed), instead of waiting forever."""
    conf = Path(os.environ["SLURM_CONF"])
    lines = [line for line in conf.read_text().splitlines()
             if not line.startswith("AccountingStorage")]
    (tmp_path / "slurm.conf").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "slurm.conf")}
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "submit", "--strategy", "single-gpu", "--wait",
         "--timeout", "240", "--set", "cluster.local_cluster=false",
         "--out", str(tmp_path / "runs"), *FAST],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "UNKNOWN" in result.stdout and "stopped waiting" not in result.stdout
    assert (tmp_path / "runs" / "smoke" / "single-gpu-1n" / "metrics.jsonl").exists()


def test_a_run_dir_with_a_live_job_is_not_submitted_into_again(slurm_cluster, tmp_path):
    # Held: a queued job holds its folder as a running one does, and never starts a rank.
    long = ["--set", "train.steps=100000", "--set", "data.corpus=synthetic",
            "--set", "cluster.extra_sbatch=['--hold']"]
    first = hpcdp("submit", "--strategy", "single-gpu", "--out", str(tmp_path / "runs"), *long,
                  cwd=tmp_path)
    job_id = first.stdout.split("submitted job ")[1].split(":")[0]
    run_dir = tmp_path / "runs" / "smoke" / "single-gpu-1n"
    experiment_before = (run_dir / "experiment.yaml").read_text()
    try:
        second = hpcdp("submit", "--strategy", "single-gpu", "--out", str(tmp_path / "runs"),
                       "--set", "train.steps=5", cwd=tmp_path, check=False)
        assert second.returncode == 2
        assert f"job {job_id}" in second.stderr and "scancel" in second.stderr
        # the queued job's experiment was not rewritten under it
        assert (run_dir / "experiment.yaml").read_text() == experiment_before
    finally:
        subprocess.run(["scancel", job_id], check=True)


def test_hpcdp_env_inside_srun_shows_what_each_rank_will_see(slurm_cluster, tmp_path):
    # One output file per task (%t): srun would interleave the tasks' lines on one stdout.
    subprocess.run(
        ["srun", "--nodes=2", "--ntasks-per-node=2", "--time=2",
         f"--output={tmp_path}/env-%t.json", sys.executable, "-m", "hpcdp", "env", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    views = [json.loads(p.read_text()) for p in tmp_path.glob("env-*.json")]
    views.sort(key=lambda v: v["rank"])
    assert [v["rank"] for v in views] == [0, 1, 2, 3]
    # Slurm picks the nodes: the master is the allocation's first node, whichever that is.
    first_node = views[0]["hosts"][0]
    assert {len(v["hosts"]) for v in views} == {2}
    assert {v["world_size"] for v in views} == {4}
    assert {v["master_addr"] for v in views} == {first_node}
    assert len({v["master_port"] for v in views}) == 1
    assert [v["horovod"]["cross_rank"] for v in views] == [0, 0, 1, 1]
    assert [v["horovod"]["local_rank"] for v in views] == [0, 1, 0, 1]
    assert views[3]["torch_env"]["RANK"] == "3" and views[3]["node_rank"] == 1
