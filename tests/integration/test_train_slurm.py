"""`python -m train` started by srun on two nodes of the local Slurm cluster, as the rendered
scripts start it: DDP (gloo), Horovod with the MPI controller (srun --mpi=pmix) and Horovod with
the Gloo controller (plain srun; train/ serves the rendezvous from SLURM_* variables).

All three see the same global batch (2 ranks x 4): their losses must agree with each other, and
every run's replicas must end bit-identical. A USR2 forwarded by srun (what the scripts do near
the time limit) must stop the ranks with a checkpoint.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from horovod_probe import horovod_importable

ROOT = Path(__file__).resolve().parents[2]
SETS = ["train.steps=8", "train.log_interval=1", "train.eval_interval=0",
        "train.checkpoint_interval=0", "train.micro_batch_size=4", "data.corpus=synthetic",
        "train.lr=1.0e-3"]

pytestmark = pytest.mark.slurm


def srun(out: Path, strategy: str, extra_env: dict[str, str], mpi: str | None = None,
         sets: list[str] = SETS) -> list[str]:
    env = ",".join(["ALL", "OMP_NUM_THREADS=1", f"PYTHONPATH={ROOT}",
                    "HPCDP_NETWORK_INTERFACE=lo", "OMPI_ALLOW_RUN_AS_ROOT=1",
                    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                    *[f"{k}={v}" for k, v in extra_env.items()]])
    cmd = ["srun", "--nodes=2", "--ntasks-per-node=1", "--time=5", f"--export={env}",
           "--kill-on-bad-exit=1", *([f"--mpi={mpi}"] if mpi else []),
           sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", strategy,
           "--out", str(out), "--resume", "--expect-world", "2", "--expect-tasks-per-node", "1"]
    return cmd + [a for s in sets for a in ("--set", s)]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


CASES = {
    "ddp": ("distributed-ps", {}, None),
    "horovod-mpi": ("horovod", {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"},
                    "pmix"),
    "horovod-gloo": ("horovod", {"HOROVOD_CONTROLLER": "gloo",
                                 "HOROVOD_CPU_OPERATIONS": "gloo"}, None),
}


def test_two_nodes_ddp_and_both_horovod_controllers_agree(slurm_cluster: Path,
                                                           tmp_path: Path) -> None:
    losses = {}
    for case, (strategy, env, mpi) in CASES.items():
        if strategy == "horovod" and not horovod_importable():
            pytest.skip("horovod is not installed: run scripts/install-horovod.sh")
        out = tmp_path / case
        done = subprocess.run(srun(out, strategy, env, mpi), cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{case}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        recs = records(out)
        header = recs[0]
        assert (header["world_size"], header["nodes"], header["launcher"]) == (2, 2, "slurm")
        assert header["slurm_job_id"]
        summary = recs[-1]
        assert summary["status"] == "completed" and summary["replicas_identical"] is True
        losses[case] = [r["loss"] for r in recs if r["kind"] == "step"]
    assert losses["horovod-mpi"] == pytest.approx(losses["ddp"], rel=1e-4)
    assert losses["horovod-gloo"] == pytest.approx(losses["ddp"], rel=1e-4)


def test_usr2_forwarded_by_srun_stops_both_ranks_with_a_checkpoint(slurm_cluster: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = srun(out, "distributed-ps", {}, sets=[*SETS, "train.steps=100000"])
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
