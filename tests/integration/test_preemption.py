"""Preemption on the local cluster (partitions low and high, PreemptMode=REQUEUE, a grace
time): a two-node DDP job in "low" is preempted by a job in "high" that needs its nodes, gets
SIGTERM, checkpoints within the grace time, is requeued by Slurm (once: the batch shell does
not requeue it again), resumes, and ends with the losses of an uninterrupted run: no step lost
or doubled, one restart in harvest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from slurm_jobs import (
    REQUEUED_DDP_PAUSE,
    REQUEUED_DDP_SETTINGS,
    REQUEUED_DDP_STEPS,
    logs,
    records,
    sets,
    submit,
    wait_all,
    wait_for_step,
)

pytestmark = pytest.mark.slurm

STEPS, PAUSE_AT = REQUEUED_DDP_STEPS, REQUEUED_DDP_PAUSE
NODES = "node3,node4"  # by name: the high job must need exactly the low job's nodes
# tests/conftest.py's straight DDP job is the reference: the same settings, placed otherwise.
SETTINGS = [*REQUEUED_DDP_SETTINGS, *sets(f"cluster.extra_sbatch=['--nodelist={NODES}']")]


def test_a_preempted_job_checkpoints_is_requeued_once_and_resumes(slurm_cluster, requeued_ddp,
                                                                  tmp_path):
    partitions = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True,
                                text=True).stdout.split()
    if "low" not in partitions or "high" not in partitions:
        pytest.skip("this cluster has no low/high partitions (restart: hpcdp cluster down; up)")
    straight = requeued_ddp["straight"]
    low_id, run_dir = submit(tmp_path, "distributed-ps", 2, tmp_path / "low", *SETTINGS,
                             "--set", "cluster.partition=low",
                             env={"HPCDP_FAULT": f"pause@{PAUSE_AT}"})
    wait_for_step(run_dir, PAUSE_AT)
    high = subprocess.run(
        ["sbatch", "--parsable", "--partition=high", f"--nodelist={NODES}", "--exclusive",
         "--output=/dev/null", "--wrap", "sleep 2"], capture_output=True, text=True, check=True)
    infos = wait_all([low_id, high.stdout.strip()], timeout_s=400)
    log = logs(run_dir)
    assert infos[low_id].state == "COMPLETED", f"{infos[low_id]}\n{log[-3000:]}"
    assert infos[low_id].restarts == 1, infos[low_id]  # requeued once, by Slurm
    assert "the ranks stopped after a checkpoint (SIGTERM)" in log, log[-3000:]
    assert "requeueing job" not in log  # the batch shell did not requeue it a second time
    recs = records(run_dir)
    summaries = [r for r in recs if r["kind"] == "summary"]
    assert [s["status"] for s in summaries] == ["interrupted", "completed"]
    steps = [r["step"] for r in recs if r["kind"] == "step"]
    assert sorted(steps) == list(range(1, STEPS + 1)), steps  # none lost, none doubled
    reference = {r["step"]: r["loss"] for r in records(straight) if r["kind"] == "step"}
    assert {r["step"]: r["loss"] for r in recs if r["kind"] == "step"} == reference
    harvest = subprocess.run([sys.executable, "-m", "hpcdp", "harvest", str(run_dir),
                              "--format", "json", "--no-plots"], capture_output=True,
                             text=True, check=True, cwd=tmp_path)
    row = json.loads(harvest.stdout)["runs"][0]
    assert row["restarts"] == 1 and row["segments"] == 2
