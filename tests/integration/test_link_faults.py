"""Faults on the local cluster's network (issue 45): a node's link cut in the middle of a
2-node step, for DDP (gloo) and Horovod (MPI). Both sides stay alive and wait for each other,
as in a real partition; the progress watchdog ends every rank within the hang bound, and the
summary names the node whose link was cut (its ranks cannot reach the Slurm controller), not
the one that only waited. Restored before Slurm's SlurmdTimeout, the link lets Slurm end the
job FAILED (a node Slurm declares failed is requeued instead: NODE_FAIL)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from horovod_probe import horovod_importable
from slurm_jobs import logs, sets, submit, wait_all, wait_for_step

from hpcdp import cluster

pytestmark = pytest.mark.slurm

TIMEOUT_S, MARGIN_S, CUT_AT = 20, 25, 3
SETTINGS = sets("train.steps=100000", "train.eval_interval=0", "train.checkpoint_interval=0",
                "train.checkpoint_every_s=0", "train.micro_batch_size=2",
                "data.corpus=synthetic", f"train.dist_timeout_s={TIMEOUT_S}",
                "train.hang_floor_s=5",
                # Nodes of their own: cutting one job's node must not cut the other's.
                "cluster.extra_sbatch=[--exclusive]")


def _node_of_rank(run_dir: Path, rank: int) -> str:
    return json.loads((run_dir / "ranks" / f"rank-{rank}.json").read_text())["node"]


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    return path.exists()


def test_a_cut_link_ends_every_rank_within_the_bound_naming_the_node_cut_off(
        slurm_cluster, tmp_path):
    if cluster.network_mode() != "namespaces":
        pytest.skip("the cluster runs without its node network here: no link to cut")
    strategies = ["distributed-ps"] + (["horovod"] if horovod_importable() else [])
    jobs = {s: submit(tmp_path, s, 2, tmp_path / s, *SETTINGS) for s in strategies}
    cut = {}
    try:
        for _, run_dir in jobs.values():
            wait_for_step(run_dir, CUT_AT)
        for strategy, (_, run_dir) in jobs.items():
            # Rank 1's node, whichever Slurm handed out; the job's other node only waits.
            cut[strategy] = _node_of_rank(run_dir, 1)
            assert cluster.set_link_state(cut[strategy], "down") == 0
        cut_at = time.monotonic()
        for strategy, (_, run_dir) in jobs.items():
            summary = run_dir / "hang" / "summary.txt"
            assert _wait_for(summary, TIMEOUT_S + MARGIN_S - (time.monotonic() - cut_at)), (
                f"{strategy}: no hang summary {TIMEOUT_S + MARGIN_S} s after the cut\n"
                + logs(run_dir)[-3000:])
            text = summary.read_text()
            waited = _node_of_rank(run_dir, 0)
            assert f"cut off: {cut[strategy]} (its ranks [1] cannot reach" in text, text
            assert f"ranks that only waited for it: [0] on {waited}" in text, text
            assert (run_dir / "hang" / "silent_nodes").read_text() == f"{cut[strategy]}\n"
            assert (run_dir / "hang" / "rank-1.txt").exists()  # the cut side's own stack
    except BaseException:
        # Jobs of 100000 steps: a failed test must not leave them holding the nodes.
        subprocess.run(["scancel", *[job_id for job_id, _ in jobs.values()]])
        raise
    finally:
        for node in set(cut.values()):
            cluster.set_link_state(node, "up")
    infos = wait_all([job_id for job_id, _ in jobs.values()], timeout_s=120)
    for strategy, (job_id, run_dir) in jobs.items():
        assert infos[job_id].state == "FAILED", f"{strategy}: {infos[job_id]}"
        assert "WATCHDOG" in logs(run_dir)
