"""Gradient accumulation with FSDP2 reduce-scatters once per optimizer step, not once per
micro-batch: every micro-step but the last runs with set_requires_gradient_sync(False)
(train/strategies/fsdp.py `no_sync`; issue 20 item 2). Counted, not timed: a real two-rank gloo
run under torchrun accumulating 4 micro-batches, each rank counting the reduce-scatters
torch.distributed is asked for: one per FSDP unit (each block, then the root: the wrapping
train/strategies/fsdp.py does) per optimizer step, what a run without accumulation sends
(measured: 9 on each rank for 3 steps of the 2-block model). Without the sync switch it would
send 4x as many."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_port import free_port

from hpcdp.config import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3

# Wraps FSDP2's reduce-scatter entry points (reduce_scatter_single in torch 2.13, and
# reduce_scatter_tensor where it is that), then runs `python -m train`'s main in-process.
COUNTING_RANK = '''
import json, os, sys
import torch.distributed as dist

counts = {}
def counting(name):
    real = getattr(dist, name)
    def call(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)
    setattr(dist, name, call)
for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
    if hasattr(dist, name):
        counting(name)
from train.__main__ import main
code = main(sys.argv[1:])
with open(os.path.join(os.environ["COUNTS_DIR"], "rank-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(counts, f)
sys.exit(code)
'''


def _reduce_scatters(tmp_path: Path, name: str, micro_batch: int, accum: int) -> list[int]:
    """Each rank's count of reduce-scatter calls over a STEPS-step fsdp run."""
    counts, program = tmp_path / f"{name}-counts", tmp_path / "counting_rank.py"
    counts.mkdir()
    program.write_text(COUNTING_RANK)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_", "HPCDP_"))}
    env |= {"OMP_NUM_THREADS": "1", "COUNTS_DIR": str(counts),
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")}
    sets = [f"train.steps={STEPS}", "train.eval_interval=0", "train.checkpoint_interval=0",
            "train.checkpoint_every_s=0", "data.corpus=synthetic",
            f"train.micro_batch_size={micro_batch}", f"train.grad_accum_steps={accum}"]
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(program),
         "--experiment", "smoke", "--strategy", "fsdp", "--out", str(tmp_path / name),
         *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    per_rank = [json.loads((counts / f"rank-{r}.json").read_text()) for r in (0, 1)]
    return [sum(c.values()) for c in per_rank]


def test_fsdp_accumulation_reduce_scatters_once_per_optimizer_step(tmp_path):
    accumulated = _reduce_scatters(tmp_path, "accumulated", micro_batch=1, accum=4)
    if accumulated == [0, 0]:
        pytest.fail("no reduce-scatter was counted: FSDP2 calls another entry point now "
                    "(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)")
    units = MODEL_PRESETS["tiny"][0] + 1  # the smoke experiment's blocks, and the root
    assert accumulated == [units * STEPS] * 2, accumulated
