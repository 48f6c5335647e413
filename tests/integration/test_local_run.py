"""`hpcdp run`: the demo's fallback where no Slurm can start. Real local processes (python,
torchrun), the same experiment file and run layout as a Slurm job, no SLURM_* variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAST = ["--set", "train.steps=5", "--set", "train.eval_interval=0",
        "--set", "data.corpus=synthetic"]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_local_run(stdout: str, run_dir: Path, world: int) -> None:
    assert "local process" in stdout and "no Slurm" in stdout
    header, *_, summary = records(run_dir)
    assert header["world_size"] == world and header["slurm_job_id"] in (None, "")
    assert summary["status"] == "completed" and summary["replicas_identical"] is True
    assert (run_dir / "job.sbatch").exists()  # the same script, ready for a later sbatch


# hsdp: the sharded strategies start as DDP does (torchrun); one node of 2 ranks is a 1 x 2 mesh.
@pytest.mark.parametrize("strategy,world", [("single-gpu", 1), ("hsdp", 2)])
def test_hpcdp_run_trains_as_local_processes(strategy, world, tmp_path):
    # Even inside an allocation, `hpcdp run` must not let srun's variables describe its world.
    env = {**os.environ, "SLURM_JOB_ID": "999", "SLURM_PROCID": "3", "SLURM_NTASKS": "8"}
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "run", "--strategy", strategy, "--ranks", "2",
         "--out", str(tmp_path / "runs"), *FAST],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_local_run(result.stdout, tmp_path / "runs" / "smoke" / f"{strategy}-1n", world)


def test_hpcdp_run_trains_ddp_as_local_processes(local_ddp_run):
    """DDP on 2 ranks, the same way (tests/conftest.py's shared run, started with SLURM_* set)."""
    check_local_run(local_ddp_run["stdout"], local_ddp_run["run_dir"], 2)


def test_hpcdp_run_refuses_more_than_one_node(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hpcdp", "run", "--strategy", "ddp",
                             "--nodes", "2", "--out", str(tmp_path / "runs")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--nodes 2" in result.stderr and "hpcdp submit" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_hpcdp_run_horovod_twice_resumes_instead_of_deadlocking(local_horovod_run):
    """The second run resumes from the first one's final checkpoint: rank 0 broadcasts its path,
    the other rank passes None. Before the fix they waited on differently named collectives
    until the launch's timeout. (tests/conftest.py's two runs, which test_export.py exports.)"""
    second = local_horovod_run["outputs"][1]
    assert "resumed from" in second and "nothing to do" in second
    headers = [r for r in records(local_horovod_run["run_dir"]) if r["kind"] == "header"]
    assert [h["start_step"] for h in headers] == [0, 6]


def test_a_finished_run_folder_is_not_continued_with_other_settings(tmp_path):
    """`hpcdp run` after the demo once reused its finished folder, rewrote experiment.yaml and
    resumed from its checkpoint with other settings."""
    def hpcdp_run(*extra):
        return subprocess.run([sys.executable, "-m", "hpcdp", "run", "--strategy", "single-gpu",
                               "--out", str(tmp_path / "runs"), *FAST, *extra], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    assert hpcdp_run().returncode == 0
    run_dir = tmp_path / "runs" / "smoke" / "single-gpu-1n"
    before = (run_dir / "experiment.yaml").read_text()
    other = hpcdp_run("--set", "train.steps=9")
    assert other.returncode == 2
    (line,) = other.stderr.strip().splitlines()
    assert "train.steps=5, not 9" in line and "--fresh" in line
    assert (run_dir / "experiment.yaml").read_text() == before
    # Only how often it logs: the same run, continued (here: already at its last step).
    same = hpcdp_run("--set", "train.log_interval=2")
    assert same.returncode == 0 and "nothing to do" in same.stdout
    # issue 48, item 12: that start trained nothing, so it is no resume in harvest; and a job
    # that would train nothing is not queued (render, submit): said at once instead
    from hpcdp import harvest

    assert harvest.harvest([run_dir], query_slurm=False)[0].restarts == 0
    for command in ("submit", "render"):
        queued = subprocess.run([sys.executable, "-m", "hpcdp", command, "--strategy",
                                 "single-gpu", "--out", str(tmp_path / "runs"), *FAST],
                                cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert queued.returncode == 2, (command, queued.stdout, queued.stderr)
        (line,) = queued.stderr.strip().splitlines()
        assert "already finished at step 5 (train.steps 5): nothing to train" in line, line
    fresh = hpcdp_run("--set", "train.steps=9", "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    (old,) = run_dir.parent.glob("single-gpu-1n.old-*")
    assert "  steps: 5\n" in (old / "experiment.yaml").read_text()
    assert [r["steps"] for r in records(old) if r["kind"] == "summary"] == [5, 5]
    assert [r["steps"] for r in records(run_dir) if r["kind"] == "summary"] == [9]


def test_a_setting_every_rank_refuses_is_said_once(tmp_path):
    """issue 36, item 7: each of the 2 ranks refuses the same bad setting; the user reads its
    line once, then torchrun's one line, no ChildFailedError traceback, and exit 2."""
    env = {**os.environ, "HPCDP_PEAK_FLOPS": "fast"}
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "run", "--strategy", "distributed-ps", "--ranks", "2",
         "--out", str(tmp_path / "runs"), *FAST],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error: HPCDP_PEAK_FLOPS='fast' is not valid") == 1, result.stderr
    assert "2 rank(s) failed" in result.stderr and "Traceback" not in result.stderr
