"""One trainer per run folder (issue 36 item 2): a Slurm job and `hpcdp run` trained in one folder
at once, interleaving their steps in one metrics.jsonl. Every way of starting a trainer now
claims the folder (train/ holds RUN_DIR/.trainer.lock, hpcdp/run_lock.py) and is refused, in one
line naming the holder, while another live trainer holds it: `hpcdp run`, `hpcdp submit`,
`hpcdp compare`, `python -m train`, and a rendered script sbatch'ed by hand. Both orders."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import logs, records, submit, wait_all, wait_for_step

ROOT = Path(__file__).resolve().parents[2]
LONG = ["--set", "train.steps=100000", "--set", "train.eval_interval=0",
        "--set", "data.corpus=synthetic", "--set", "train.log_interval=1",
        "--set", "train.checkpoint_interval=0"]
# A holder only has to be alive and hold its folder: its ranks wait after step 2 (up to 120 s,
# train/faults.py) instead of spending the cores the other tests train on.
HOLD = {"HPCDP_FAULT": "pause@2"}


def quick() -> dict[str, str]:
    """This environment (SLURM_CONF once the cluster fixture set it), where a refused trainer
    waits 3 s for the holder to let go instead of HPCDP_LOCK_WAIT_S's default 30."""
    return {**os.environ, "HPCDP_LOCK_WAIT_S": "3"}


def hpcdp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180, env=quick())


def python_m_train(run_dir: Path) -> subprocess.CompletedProcess:
    """A trainer started by hand, as a rank of a job would be."""
    env = {k: v for k, v in quick().items() if not k.startswith(("SLURM_", "OMPI_"))}
    return subprocess.run(
        [sys.executable, "-m", "train", "--experiment", str(run_dir / "experiment.yaml"),
         "--strategy", "single-gpu", "--out", str(run_dir), "--resume"],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=180)


def headers(run_dir: Path) -> int:
    return sum(r["kind"] == "header" for r in records(run_dir))


def refused(result: subprocess.CompletedProcess, holder: str) -> str:
    """The one-line refusal naming `holder`; asserts exit 2 and no traceback."""
    said = result.stdout + result.stderr
    assert result.returncode == 2, said[-3000:]
    lines = [line for line in said.splitlines() if "is in use by a trainer" in line]
    assert len(lines) == 1 and holder in lines[0], said[-3000:]
    assert "Traceback" not in said
    return lines[0]


@pytest.fixture
def local_trainer(tmp_path):
    """`hpcdp run` of DDP on 2 local ranks in tmp_path/runs/smoke/distributed-ps-1n, alive
    (waiting after step 2) until the test ends."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **HOLD}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdp", "run", "-s", "ddp", "--ranks", "2",
         "--out", str(tmp_path / "runs"), *LONG],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    run_dir = tmp_path / "runs" / "smoke" / "distributed-ps-1n"
    try:
        wait_for_step(run_dir, 2, timeout_s=180)
        yield run_dir
    finally:
        # torchrun starts its ranks in sessions of their own: killing hpcdp run's group would
        # orphan them. SIGTERM lets torchrun stop them; then anything left that trains here.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        subprocess.run(["pkill", "-9", "-f", f"[-]-out {run_dir} "], check=False)


def test_a_trainer_started_by_hpcdp_run_keeps_its_folder(local_trainer, tmp_path):
    holder = f"on {socket.gethostname()}"
    line = refused(hpcdp("run", "-s", "ddp", "--ranks", "2", "--out", str(tmp_path / "runs"),
                         *LONG, cwd=tmp_path), holder)
    assert str(local_trainer) in line and "pid " in line and "give another --out" in line
    # --fresh would move the live run aside: refused the same way, nothing moved
    refused(hpcdp("run", "-s", "ddp", "--ranks", "2", "--out", str(tmp_path / "runs"), "--fresh",
                  *LONG, cwd=tmp_path), holder)
    assert not list(local_trainer.parent.glob("distributed-ps-1n.*"))
    # The trainer itself refuses too, where no command checked first
    refused(python_m_train(local_trainer), holder)
    assert headers(local_trainer) == 1


@pytest.mark.slurm
def test_slurm_ways_in_are_refused_while_hpcdp_run_trains(slurm_cluster, local_trainer,
                                                           tmp_path):
    holder = f"on {socket.gethostname()}"
    refused(hpcdp("submit", "-s", "ddp", "--out", str(tmp_path / "runs"), *LONG, cwd=tmp_path),
            holder)
    # By hand: the script `hpcdp run` wrote beside its run; the job's trainer refuses in its log
    by_hand = subprocess.run(["sbatch", "--parsable", str(local_trainer / "job.sbatch")],
                             capture_output=True, text=True, check=True, env=quick())
    job_id = by_hand.stdout.strip().split(";")[0]
    assert wait_all([job_id], timeout_s=240)[job_id].state == "FAILED"
    log = logs(local_trainer)
    lines = [line for line in log.splitlines() if "is in use by a trainer" in line]
    assert len(lines) == 1 and holder in lines[0], log[-3000:]
    assert "Traceback" not in log
    assert headers(local_trainer) == 1  # the job never wrote a step


@pytest.mark.slurm
def test_hpcdp_run_and_python_m_train_are_refused_while_a_job_trains(slurm_cluster, tmp_path):
    job_id, run_dir = submit(tmp_path, "ddp", 1, tmp_path / "runs", *LONG, env=HOLD)
    try:
        wait_for_step(run_dir, 2, timeout_s=240)
        line = refused(hpcdp("run", "-s", "ddp", "--ranks", "2", "--out",
                             str(tmp_path / "runs"), *LONG, cwd=tmp_path), f"job {job_id} (")
        assert f"scancel {job_id}" in line
        refused(python_m_train(run_dir), f"job {job_id} (")
        steps = [r["step"] for r in records(run_dir) if r["kind"] == "step"]
        assert steps == sorted(steps) and headers(run_dir) == 1
    finally:
        subprocess.run(["scancel", job_id], check=False)
        wait_all([job_id], timeout_s=120)
    assert re.search(r"pid \d+ on \S+", line)
