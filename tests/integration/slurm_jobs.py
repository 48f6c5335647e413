"""Helpers for tests that submit real jobs to the local cluster and read what they wrote."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hpcdp import slurm


def sets(*pairs: str) -> list[str]:
    """`--set k=v` for each pair."""
    return [arg for pair in pairs for arg in ("--set", pair)]


def beside_partition() -> str:
    """The partition for jobs that run beside the debug partition's tests: the local cluster's
    gpu partition (two nodes of their own; its CPUs, no GPU asked for), or debug where it has
    none (the jobs then queue among the others'). Tests that submit there are marked
    gpu_partition, and scripts/test.sh runs them in a stream beside the Slurm tests."""
    found = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%D"], capture_output=True,
                           text=True).stdout.split()
    return "gpu" if found and int(found[0]) >= 2 else "debug"


def submit(cwd: Path, strategy: str, nodes: int, out: Path, *extra: str,
           env: dict[str, str] | None = None) -> tuple[str, Path]:
    """`hpcdp submit` one cell; returns (job id, run dir) as hpcdp printed them."""
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "submit", "--strategy", strategy, "--nodes", str(nodes),
         "--out", str(out), *extra],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)
    run_dir = Path(re.search(r"run:\s+(\S.*)", result.stdout).group(1).strip())
    return job_id, run_dir


def wait_all(job_ids: list[str], timeout_s: float = 600) -> dict[str, slurm.JobInfo]:
    """Wait until slurmdbd has the final record of every job (sacct lags squeue)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        infos = slurm.query_jobs(job_ids)
        if all(slurm.is_terminal(infos[j].state) and infos[j].source == "sacct" for j in job_ids):
            return infos
        time.sleep(0.5)  # a job's final record is in sacct ~0.1 s after it leaves squeue
    raise AssertionError(f"jobs {job_ids} did not all end within {timeout_s} s")


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def logs(run_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(run_dir.glob("slurm-*.out")))


def wait_for_step(run_dir: Path, step: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(r["kind"] == "step" and r["step"] == step for r in records(run_dir)):
        assert time.monotonic() < deadline, f"{run_dir}: step {step} never logged\n" + logs(
            run_dir)[-3000:]
        time.sleep(0.5)


# tests/conftest.py's `requeued_ddp`: DDP on 2 nodes, every step logged, no checkpoint but the
# one a stop takes. Jobs compared with it bit for bit run with exactly these settings.
REQUEUED_DDP_STEPS, REQUEUED_DDP_PAUSE = 10, 4
REQUEUED_DDP_SETTINGS = sets(f"train.steps={REQUEUED_DDP_STEPS}", "train.log_interval=1",
                             "train.eval_interval=5", "train.checkpoint_interval=0",
                             "train.checkpoint_every_s=0", "train.micro_batch_size=4",
                             "data.corpus=synthetic")
TRACKERS = "train.trackers=[tensorboard,mlflow,wandb]"
