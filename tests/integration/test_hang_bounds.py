"""A rank that hangs (HPCDP_FAULT=hang@STEP:1 makes rank 1 SIGSTOP itself, as `kill -STOP`
would) ends a two-node job FAILED within train.dist_timeout_s plus a margin, for DDP and for
Horovod over MPI (which no collective timeout bounds) and over Gloo; the live ranks' stacks and
the name of the silent rank are in RUN_DIR/hang/. Before the progress watchdog, Horovod over MPI
ran on until the time limit."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from slurm_jobs import logs, sets, submit, wait_all, wait_for_step

pytestmark = pytest.mark.slurm

TIMEOUT_S, MARGIN_S, HANG_AT = 20, 40, 3
SETTINGS = sets("train.steps=100000", "train.eval_interval=0", "train.checkpoint_interval=0",
                "train.checkpoint_every_s=0", "train.micro_batch_size=2",
                "data.corpus=synthetic", f"train.dist_timeout_s={TIMEOUT_S}",
                "train.hang_floor_s=5")
CELLS = [("distributed-ps", None), ("horovod", "mpi"), ("horovod", "gloo")]


def test_a_stopped_rank_ends_the_job_failed_within_the_timeout(slurm_cluster, tmp_path):
    has_horovod = subprocess.run([sys.executable, "-c", "import horovod.torch"],
                                 capture_output=True).returncode == 0
    cells = [c for c in CELLS if c[1] is None or has_horovod]
    jobs = {}
    for strategy, controller in cells:
        extra = sets(f"cluster.horovod_controller={controller}") if controller else []
        jobs[(strategy, controller)] = submit(
            tmp_path, strategy, 2, tmp_path / f"{strategy}-{controller}", *SETTINGS, *extra,
            env={"HPCDP_FAULT": f"hang@{HANG_AT}:1"})
    hung_at = {}
    for cell, (_, run_dir) in jobs.items():
        wait_for_step(run_dir, HANG_AT)
        hung_at[cell] = time.monotonic()
    infos = wait_all([job_id for job_id, _ in jobs.values()], timeout_s=300)
    ended = time.monotonic()
    for cell, (job_id, run_dir) in jobs.items():
        log = logs(run_dir)
        assert infos[job_id].state == "FAILED", f"{cell}: {infos[job_id]}\n{log[-3000:]}"
        assert ended - hung_at[cell] < TIMEOUT_S + MARGIN_S, cell
        assert "WATCHDOG: rank 0" in log and f"after step {HANG_AT}" in log, log[-3000:]
        dump = (run_dir / "hang" / "rank-0.txt").read_text()
        assert "Thread" in dump and "File" in dump  # faulthandler's stack of every thread
        summary = (run_dir / "hang" / "summary.txt").read_text()
        assert "silent ranks (stopped, dead, or stuck where no thread runs): [1]" in summary
    if len(cells) < len(CELLS):
        pytest.skip("Horovod is not installed: only DDP was checked")
