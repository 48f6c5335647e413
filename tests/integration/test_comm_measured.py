"""Communication measurements mean what they say, from real gloo processes (no Slurm):

- DDP's all-reduce is timed on every step by hpcdp's own hook: consecutive steps past step 10
  differ (DDP's reducer stops sampling after iteration 10, so its figures froze there), the
  bytes are the gradient's, and the loop's elapsed time covers every step;
- DataParallel's reduction is not timed: its exposed communication is null, not 0;
- the network probe follows nccl-tests (20 timed iterations after 5 warm-up, the sizes of
  DDP's bucket and Horovod's fusion buffer unless capped, the gradient always), and an fp16
  probe at 4 ranks sums exactly (the old probe's in-place sums of ones overflowed fp16);
  capped as the local profile caps it, a 4-rank probe's sweep stays well under 10 s here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_port import free_port

from hpcdp.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SETS = ["data.corpus=synthetic", "train.eval_interval=0", "train.checkpoint_interval=0",
        "train.log_interval=1"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_", "HPCDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)
    return env


def _torchrun(ranks: int, port: int, *args: str, env: dict[str, str] | None = None,
              timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "train", *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env or _env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _sets(*sets: str) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def test_ddp_all_reduce_is_measured_on_every_step(local_ddp_run):
    """tests/conftest.py's shared 2-rank DDP run: 14 steps, every one logged."""
    steps = local_ddp_run["steps"]
    assert steps > 11  # steps past the reducer's 10 sampled iterations
    recs = _records(local_ddp_run["run_dir"])
    header = recs[0]
    records = [r for r in recs if r["kind"] == "step"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        comm = r["ddp_comm_s"]
        assert set(comm) == {"allreduce", "exposed", "window"}
        assert 0 < comm["allreduce"] <= comm["window"] + 1e-9 and 0 <= comm["exposed"]
        assert comm["exposed"] <= comm["window"] + 1e-9
        assert r["allreduce_s"] == comm["allreduce"] and r["exposed_comm_s"] == comm["exposed"]
        # Every bucket of the gradient, once: the header's bytes on the wire.
        assert r["allreduce_bytes"] == header["grad_bytes_per_step"] and r["allreduce_calls"] >= 1
        assert comm["window"] < r["step_time_s"]
        # The ranks' own work, gathered with the loss: each one's step less its wait
        work = r["rank_work_s"]
        assert work["ranks"] == 2 and work["slowest"] in (0, 1), work
        # (each rank times its own step: rank 1's may be longer than rank 0's)
        assert 0 < work["min"] <= work["mean"] <= work["max"] < 10 * r["step_time_s"]
        assert work["sd"] == pytest.approx((work["max"] - work["min"]) / math.sqrt(2))
        assert r["step_time_s"] - comm["exposed"] in (pytest.approx(work["min"], rel=1e-4),
                                                      pytest.approx(work["max"], rel=1e-4))
    # Measured, not the reducer's frozen averages: every late step its own figure.
    late = [r["ddp_comm_s"]["allreduce"] for r in records[10:]]
    assert len(set(late)) == len(late), late
    (summary,) = [r for r in recs if r["kind"] == "summary"]
    assert summary["tokens_trained"] == steps * header["tokens_per_step"]
    # From the first step's start to the loop's end: every step, and what lies between them.
    assert summary["train_elapsed_s"] >= sum(r["step_time_s"] for r in records)
    assert summary["train_elapsed_s"] <= summary["elapsed_s"]
    assert summary["tokens_per_elapsed_s"] == pytest.approx(
        summary["tokens_trained"] / summary["train_elapsed_s"])


def test_data_parallel_communication_is_unmeasured_not_zero(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-ps",
         "--out", str(tmp_path), *_sets(*SETS, "train.steps=3")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [r for r in _records(tmp_path) if r["kind"] == "step"]
    assert len(records) == 3
    assert all(r["exposed_comm_s"] is None and r["allreduce_s"] is None for r in records)
    assert all(r["rank_work_s"] is None for r in records)  # one process: no ranks to compare


def test_the_probe_sweeps_sizes_and_sums_fp16_exactly_at_four_ranks(tmp_path):
    done = _torchrun(4, free_port(), "allreduce", "--experiment", "smoke", "--strategy",
                     "distributed-ps", "--out", str(tmp_path),
                     *_sets("train.grad_comm=fp16"),
                     env=_env(HPCDP_ALLREDUCE_MAX_MB="4"))
    result = json.loads((tmp_path / "allreduce.json").read_text())
    print(done.stdout.strip().splitlines()[-1])
    assert (result["world_size"], result["grad_comm"], result["warmup"]) == (4, "fp16", 5)
    sweep = result["sweep"]
    sizes = [e["bytes"] for e in sweep]
    assert sizes == sorted(sizes) and max(sizes) <= 4 << 20 and min(sizes) == 1024
    (grad,) = [e for e in sweep if e["what"] == "gradient"]
    # The top level is the gradient's size, as before the sweep.
    assert {k: result[k] for k in grad if k != "what"} == {k: v for k, v in grad.items()
                                                            if k != "what"}
    assert grad["bytes"] == 2 * grad["elements"]
    for e in sweep:
        assert e["iterations"] == len(e["times_s"]) == 20 and e["correct"] is True
        assert e["busbw_GBps"] == pytest.approx(e["algbw_GBps"] * 2 * 3 / 4)
    assert result["max_bytes"] == 4 << 20
    assert result["probe_s"] < 10  # the sweep itself, inside every campaign of the tests


def test_an_uncapped_probe_includes_the_bucket_and_fusion_sizes():
    # The size list of a real cluster's probe (no HPCDP_ALLREDUCE_MAX_MB), without running it.
    from train import allreduce

    listed = allreduce.sizes(400_000_000, 4, allreduce.max_bytes({}))
    named = {what: elements * 4 for elements, what in listed if what}
    assert named == {"ddp bucket": 25 << 20, "horovod fusion": 64 << 20,
                     "gradient": 400_000_000}
    assert max(e for e, _ in listed) * 4 == 400_000_000 and min(e for e, _ in listed) == 256
    capped = allreduce.sizes(1_000_000, 4, allreduce.max_bytes({"HPCDP_ALLREDUCE_MAX_MB": "1"}))
    assert [w for _, w in capped if w] == ["gradient"]
    with pytest.raises(UsageError, match="HPCDP_ALLREDUCE_MAX_MB='x' is not valid"):
        allreduce.max_bytes({"HPCDP_ALLREDUCE_MAX_MB": "x"})
