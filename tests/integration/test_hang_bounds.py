"""A rank that hangs (HPCDP_FAULT=hang@STEP:1 makes rank 1 SIGSTOP itself, as `kill -STOP`
would) ends a two-node job FAILED within train.dist_timeout_s plus a margin, for DDP, FSDP2
(the sharded strategies' collectives: all-gathers in forward), and for Horovod over MPI (which
no collective timeout bounds) and over Gloo; the live ranks' stacks and
the name of the silent rank are in RUN_DIR/hang/. Before the progress watchdog, Horovod over MPI
ran on until the time limit."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from horovod_probe import horovod_importable
from slurm_jobs import logs, records, sets, submit, wait_all, wait_for_step

from hpcdp.hostlist import expand_hostlist

pytestmark = pytest.mark.slurm

TIMEOUT_S, MARGIN_S, HANG_AT = 20, 40, 3
SETTINGS = sets("train.steps=100000", "train.eval_interval=0", "train.checkpoint_interval=0",
                "train.checkpoint_every_s=0", "train.micro_batch_size=2",
                "data.corpus=synthetic", f"train.dist_timeout_s={TIMEOUT_S}",
                "train.hang_floor_s=5")
CELLS = [("distributed-ps", None), ("fsdp", None), ("horovod", "mpi"), ("horovod", "gloo")]


def test_a_stopped_rank_ends_the_job_failed_within_the_timeout(slurm_cluster, tmp_path):
    cells = [c for c in CELLS if c[1] is None or horovod_importable()]
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


def test_on_hang_requeue_resubmits_without_the_silent_node(slurm_cluster, tmp_path):
    """train.on_hang: requeue. Rank 1 stops after step 3 (once per run folder); the watchdog
    ends the job, names rank 1's node, and the script submits itself again excluding it. The
    new job resumes from the step-2 checkpoint and finishes; every step is logged once."""
    steps = 8
    job_id, run_dir = submit(
        tmp_path, "distributed-ps", 2, tmp_path / "requeue",
        *sets(f"train.steps={steps}", "train.eval_interval=0", "train.checkpoint_interval=2",
              "train.checkpoint_every_s=0", "train.micro_batch_size=2", "data.corpus=synthetic",
              f"train.dist_timeout_s={TIMEOUT_S}", "train.hang_floor_s=5",
              "train.on_hang=requeue"),
        env={"HPCDP_FAULT": f"hang@{HANG_AT}:1"})
    first = wait_all([job_id], timeout_s=300)[job_id]
    assert first.state == "FAILED", f"{first}\n{logs(run_dir)[-3000:]}"
    silent = read_hang_file(run_dir, "silent_nodes")
    assert silent in expand_hostlist(first.node_list), (silent, first.node_list)
    new_id = read_hang_file(run_dir, "resubmitted_as")
    assert new_id.isdigit() and new_id != job_id
    second = wait_all([new_id], timeout_s=300)[new_id]
    log = logs(run_dir)
    assert second.state == "COMPLETED", f"{second}\n{log[-3000:]}"
    assert silent not in expand_hostlist(second.node_list), (silent, second.node_list)
    assert f"resubmitted as job {new_id} excluding {silent}" in log
    runs = records(run_dir)
    assert [r["start_step"] for r in runs if r["kind"] == "header"] == [0, 2]
    assert max(r["step"] for r in runs if r["kind"] == "step") == steps
    # The stopped rank's stack, read by py-spy where it runs on rank 0's machine; the local
    # cluster's nodes are separate machines (own hostname and pids), so here the file says so.
    stacks = (run_dir / "hang.1" / "rank-1.py-spy.txt").read_text()
    assert "after_step" in stacks or "py-spy cannot reach it" in stacks, stacks


def read_hang_file(run_dir, name):
    """The new job's rank 0 moves hang/ aside as hang.1/ when it starts, which can happen
    between two reads here (CI once read hang/silent_nodes and then missed
    hang/resubmitted_as): try hang/ first, then where it went."""
    for folder in ("hang", "hang.1"):
        try:
            return (run_dir / folder / name).read_text().strip()
        except FileNotFoundError:
            continue
    raise AssertionError(f"{name} is in neither {run_dir}/hang nor hang.1")


def test_py_spy_reads_the_stack_of_a_stopped_process(tmp_path):
    """What the watchdog does for a silent rank on its own machine (a stopped process cannot
    dump its own stack)."""
    from train.watchdog import _py_spy

    code = ("import os, signal\ndef stopped_here():\n    os.kill(os.getpid(), signal.SIGSTOP)\n"
            "stopped_here()\n")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while open(f"/proc/{proc.pid}/stat").read().split(") ")[1][0] != "T":
            assert time.monotonic() < deadline, "the process never stopped"
            time.sleep(0.05)
        _py_spy(proc.pid, tmp_path / "stack.txt")
    finally:
        proc.kill()
        proc.wait()
    text = (tmp_path / "stack.txt").read_text()
    if "not installed" in text:
        pytest.skip("py-spy is not installed (it comes with the train extra)")
    assert "stopped_here" in text, text


def test_a_crashing_rank_ends_the_job_failed_at_once(slurm_cluster, tmp_path):
    """One rank raises; srun stops the other, which checkpoints and exits 143 as it would in
    a preemption. The script must not take that for one and wait for a requeue."""
    job_id, run_dir = submit(tmp_path, "distributed-ps", 2, tmp_path / "crash", *SETTINGS,
                             env={"HPCDP_FAULT": f"raise@{HANG_AT}:1"})
    info = wait_all([job_id], timeout_s=300)[job_id]
    log = logs(run_dir)
    assert info.state == "FAILED", f"{info}\n{log[-3000:]}"
    # Which rank notices first is a race: the one srun stopped (143, not every rank stopped
    # after a checkpoint) or the crashing one's peer, whose collective broke (the launch's 1).
    assert re.search(r"hpcdp: a rank failed \((not every rank stopped after a checkpoint|"
                     r"the launch exited [1-9]\d*);", log), log[-3000:]
    assert "waiting for Slurm to requeue" not in log
    assert info.elapsed_s is not None and info.elapsed_s < 120, info  # not the 600 s wait


def test_a_rank_that_dies_at_start_up_is_relaunched(slurm_cluster, tmp_path):
    """Rank 1 segfaults before its strategy connects (HPCDP_FAULT=segv@start:1, once per run
    folder), as Open MPI's start-up rarely does: the script launches again in the same job,
    which then trains every step once. With HPCDP_START_RETRIES=0 the same crash fails the job."""
    steps = 6
    settings = sets(f"train.steps={steps}", "train.eval_interval=0",
                    "train.checkpoint_interval=0", "train.checkpoint_every_s=0",
                    "train.micro_batch_size=2", "data.corpus=synthetic")
    relaunched = submit(tmp_path, "distributed-ps", 2, tmp_path / "relaunched", *settings,
                        env={"HPCDP_FAULT": "segv@start:1"})
    not_relaunched = submit(tmp_path, "distributed-ps", 2, tmp_path / "not-relaunched",
                            *settings, env={"HPCDP_FAULT": "segv@start:1",
                                            "HPCDP_START_RETRIES": "0"})
    infos = wait_all([relaunched[0], not_relaunched[0]], timeout_s=300)
    log = logs(relaunched[1])
    assert infos[relaunched[0]].state == "COMPLETED", f"{infos[relaunched[0]]}\n{log[-3000:]}"
    assert re.search(r"hpcdp: a rank died at start-up \(the launch exited 1\d\d before every "
                     r"rank connected\); relaunching \(1 of 1", log), log[-3000:]
    kinds = [r["kind"] for r in records(relaunched[1])]
    steps_run = [r["step"] for r in records(relaunched[1]) if r["kind"] == "step"]
    assert kinds.count("header") == 1 and steps_run == list(range(1, steps + 1)), kinds
    log = logs(not_relaunched[1])
    assert infos[not_relaunched[0]].state == "FAILED", f"{infos[not_relaunched[0]]}\n{log[-3000:]}"
    assert "relaunching" not in log, log[-3000:]
    assert "hpcdp: a rank failed (the launch exited" in log, log[-3000:]
