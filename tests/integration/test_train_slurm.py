"""`python -m train` started by srun on two nodes of the local Slurm cluster, as the rendered
scripts start it, but by hand: DDP over gloo, with the world checked against what srun was
asked for. Its replicas must end bit-identical, and a USR2 forwarded by srun (what the scripts
do near the time limit) must stop the ranks with a checkpoint.

Horovod under srun is trained through hpcdp in test_horovod_slurm.py (both controllers: MPI
through `srun --mpi=pmix`, Gloo with train/'s rendezvous from SLURM_* variables) and
test_resume_every_strategy.py; its losses are held to DDP's in test_train_strategies.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import cluster

ROOT = Path(__file__).resolve().parents[2]
SETS = ["train.steps=8", "train.log_interval=1", "train.eval_interval=0",
        "train.checkpoint_interval=0", "train.micro_batch_size=4", "data.corpus=synthetic",
        "train.lr=1.0e-3"]

pytestmark = pytest.mark.slurm


def srun(out: Path, sets: list[str] = SETS) -> list[str]:
    """DDP on 2 nodes of 1 rank, as the rendered script's srun line starts it."""
    env = ",".join(["ALL", "OMP_NUM_THREADS=1", f"PYTHONPATH={ROOT}",
                    f"HPCDP_NETWORK_INTERFACE={cluster.node_interface()}"])
    cmd = ["srun", "--nodes=2", "--ntasks-per-node=1", "--time=5", f"--export={env}",
           "--kill-on-bad-exit=1", sys.executable, "-m", "train", "--experiment", "smoke",
           "--strategy", "distributed-ps", "--out", str(out), "--resume", "--expect-world", "2",
           "--expect-tasks-per-node", "1"]
    return cmd + [a for s in sets for a in ("--set", s)]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_nodes_of_ddp_started_by_srun_train_with_identical_replicas(
        slurm_cluster: Path, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    done = subprocess.run(srun(out), cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-2000:]}{done.stderr[-3000:]}"
    recs = records(out)
    header = recs[0]
    assert (header["world_size"], header["nodes"], header["launcher"]) == (2, 2, "slurm")
    assert header["slurm_job_id"]
    losses = [r["loss"] for r in recs if r["kind"] == "step"]
    assert len(losses) == 8 and losses[-1] < losses[0]
    summary = recs[-1]
    assert summary["status"] == "completed" and summary["replicas_identical"] is True


def test_usr2_forwarded_by_srun_stops_both_ranks_with_a_checkpoint(slurm_cluster: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = srun(out, sets=[*SETS, "train.steps=100000"])
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step 3/"):
                # What the script's trap does: signal srun, which forwards it to the tasks.
                proc.send_signal(signal.SIGUSR2)
                break
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    recs = records(out)
    summary = recs[-1]
    assert summary["kind"] == "summary" and summary["status"] == "interrupted", stderr[-3000:]
    checkpoints = [r for r in recs if r["kind"] == "checkpoint"]
    assert [c["step"] for c in checkpoints] == [summary["steps"]]
    assert Path(checkpoints[0]["path"]).is_file()
    assert proc.returncode != 0  # the ranks exit 143: not finished
