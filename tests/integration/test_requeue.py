"""The time-limit path of the rendered scripts, on the real cluster: Slurm's warning signal
reaches the batch shell (what `--signal=B:USR2@120` does before the limit; here sent at once with
`scancel --batch --signal=USR2`), the shell passes it to the ranks, they checkpoint and stop, the
shell requeues the job, and the rerun resumes from the checkpoint and completes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from hpcdp import slurm

pytestmark = pytest.mark.slurm

STEPS = 400


def test_time_limit_signal_checkpoints_requeues_and_resumes(slurm_cluster, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "submit", "--strategy", "distributed-ps", "--nodes", "2",
         "--out", str(tmp_path / "runs"), "--set", f"train.steps={STEPS}",
         "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
         "--set", "train.checkpoint_interval=0", "--set", "data.corpus=synthetic",
         "--set", "train.micro_batch_size=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    job_id = result.stdout.split("submitted job ")[1].split(":")[0]
    run_dir = tmp_path / "runs" / "smoke" / "distributed-ps-2n"
    metrics = run_dir / "metrics.jsonl"

    deadline = time.monotonic() + 120
    while not (metrics.exists() and '"kind": "step"' in metrics.read_text()):
        assert time.monotonic() < deadline, "training never started"
        time.sleep(0.5)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)

    deadline = time.monotonic() + 300
    while True:
        info = slurm.query_jobs([job_id])[job_id]
        if slurm.is_terminal(info.state) and info.source == "sacct":
            break
        assert time.monotonic() < deadline, f"job {job_id} still {info.state}"
        time.sleep(2)
    log = "\n".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert info.state == "COMPLETED", log[-3000:]
    assert "requeueing job" in log
    assert info.restarts == 1, info

    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    headers = [r for r in records if r["kind"] == "header"]
    summaries = [r for r in records if r["kind"] == "summary"]
    assert len(headers) == 2, "the rerun appends a second segment"
    assert headers[0]["restart_count"] == 0 and headers[1]["restart_count"] == 1
    stopped_at = summaries[0]["steps"]
    assert summaries[0]["status"] == "interrupted" and 0 < stopped_at < STEPS
    assert headers[1]["start_step"] == stopped_at  # resumed from the checkpoint, not step 0
    assert summaries[-1]["status"] == "completed" and summaries[-1]["steps"] == STEPS
    steps = sorted({r["step"] for r in records if r["kind"] == "step"})
    assert steps == list(range(1, STEPS + 1))

    harvest = subprocess.run([sys.executable, "-m", "hpcdp", "harvest", str(run_dir),
                              "--format", "json", "--no-plots"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=True)
    row = json.loads(harvest.stdout)["runs"][0]
    assert row["segments"] == 2 and row["restarts"] == 1 and row["state"] == "COMPLETED"
