"""`python -m train allreduce`: the network baseline of a campaign (hpcdp compare).

Every rank all-reduces tensors over the strategy's own transport (gloo or NCCL for DDP, Horovod
over MPI or Gloo), in the precision gradients travel in (train.grad_comm), as nccl-tests does:
for each message size, 5 warm-up and 20 timed iterations, each after a barrier, each
iteration's time the slowest rank's (an all-reduce MAX of the per-rank times, once at the end).
The sizes sweep 1 KiB to 256 MiB by factors of 4, plus DDP's bucket (25 MiB, bucket_cap_mb),
Horovod's fusion buffer (64 MiB, HOROVOD_FUSION_THRESHOLD) and the model's own gradient.
HPCDP_ALLREDUCE_MAX_MB leaves out the sizes above it (the local CPU cluster's profile sets it:
a 256 MiB gloo all-reduce on two shared cores takes seconds), never the gradient's.

Rank 0 writes OUT/allreduce.json: the gradient's size at the top level, every size in "sweep".
Bus bandwidth as nccl-tests defines it: algbw = bytes / time, busbw = algbw x 2(n-1)/n for n
ranks, comparable across rank counts and with the link's speed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from hpcdp import distenv
from hpcdp import strategies as registry
from hpcdp.config import Experiment
from hpcdp.errors import one_line, positive_number
from hpcdp.forecast import experiment_shapes
from hpcdp.forecast.model import DDP_BUCKET_BYTES, HOROVOD_FUSION_BYTES
from train.strategies import Strategy, create

RESULT_FILE = "allreduce.json"
WARMUP, ITERATIONS = 5, 20  # nccl-tests' defaults (-w 5 -n 20)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MiB = 1 << 20
SWEEP_BYTES = tuple(1024 * 4 ** k for k in range(10))  # 1 KiB .. 256 MiB
MAX_MB_ENV = "HPCDP_ALLREDUCE_MAX_MB"
# Every rank adds FILL each iteration and the tensor is refilled before the next: the sum stays
# n x FILL (exact in fp16 and bf16 for any rank count a cluster has), never overflows.
FILL = 2.0 ** -10


def gradient_elements(exp: Experiment) -> int:
    """Parameters of the experiment's model, from GPT-2's shapes (hpcdp/forecast/model.py; their
    match with the model train/model.py builds is tests/unit/test_model.py's). Building the
    model would import transformers, about 2 CPU-s of every probe rank's start for a count."""
    return sum(math.prod(shape) for shape in experiment_shapes(exp))


def max_bytes(environ=os.environ) -> int | None:
    """HPCDP_ALLREDUCE_MAX_MB in bytes (None: the whole sweep); anything but a positive number
    is a one-line error."""
    text = environ.get(MAX_MB_ENV, "").strip()
    if not text:
        return None
    value = positive_number(text, f"{MAX_MB_ENV}={one_line(text)!r} is not valid: give the "
                            "largest message of the network probe in MiB, e.g. 4, or leave it "
                            "unset")
    return int(value * MiB)


def sizes(gradient_bytes: int, element_size: int, cap: int | None) -> list[tuple[int, str]]:
    """(elements, what) per message size, ascending: the sweep, DDP's bucket, Horovod's fusion
    buffer and the gradient; sizes above `cap` left out, the gradient never."""
    named = {b: "" for b in SWEEP_BYTES}
    named.update({DDP_BUCKET_BYTES: "ddp bucket", HOROVOD_FUSION_BYTES: "horovod fusion"})
    out = {max(1, b // element_size): what for b, what in named.items()
           if cap is None or b <= cap}
    out[gradient_bytes // element_size] = "gradient"
    return sorted(out.items())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_all_reduce(strategy: Strategy, elements: int, dtype: torch.dtype
                    ) -> tuple[list[float], bool]:
    """The timed iterations' seconds, each the slowest rank's, and whether every rank's last
    result was the exact sum (nccl-tests' -c check)."""
    source = torch.full((elements,), FILL, dtype=dtype, device=strategy.device)
    tensor = torch.empty_like(source)
    mine = []
    for i in range(WARMUP + ITERATIONS):
        tensor.copy_(source)
        _sync(strategy.device)
        strategy.barrier()  # every rank starts together: the time is the collective's
        start = time.perf_counter()
        strategy.all_reduce_(tensor)
        _sync(strategy.device)
        if i >= WARMUP:
            mine.append(time.perf_counter() - start)
    wrong = float(not torch.all(tensor == FILL * strategy.world_size))
    slowest = torch.tensor([*mine, wrong], dtype=torch.float64, device=strategy.device)
    strategy.all_reduce_max_(slowest)  # once, after the timed loop: it does not perturb it
    *times, wrong = slowest.tolist()
    return times, not wrong


def measure(exp: Experiment, spec: registry.StrategySpec, out_dir: str | Path, *,
            expect_world: int | None = None, expect_tasks_per_node: int | None = None
            ) -> dict[str, Any]:
    env = distenv.detect()
    distenv.check_world(env, expect_world, expect_tasks_per_node)
    cap = max_bytes()
    torch.set_num_threads(distenv.threads_per_process(env))
    strategy = create(spec, log=print if env.rank == 0 else (lambda _: None))
    strategy.setup(env, exp.train.dist_timeout_s)
    try:
        grad_comm = exp.train.grad_comm if spec.grad_comm else "fp32"
        dtype = DTYPES[grad_comm]
        element_size = torch.empty((), dtype=dtype).element_size()
        gradient = gradient_elements(exp)
        began = time.perf_counter()
        # The strategy's count, not the launcher's: mpirun outside Slurm is not recognised.
        world = strategy.world_size
        sweep = [_entry(elements, what, element_size, *time_all_reduce(strategy, elements, dtype),
                        world)
                 for elements, what in sizes(gradient * element_size, element_size, cap)]
        result = {"strategy": spec.name, "communication": strategy.communication,
                  "nodes": env.num_nodes, "world_size": world,
                  "tasks_per_node": env.local_world_size, "grad_comm": grad_comm,
                  **next(e for e in sweep if e["what"] == "gradient"),
                  "warmup": WARMUP, "timing": "slowest rank per iteration, after a barrier",
                  "max_bytes": cap, "probe_s": time.perf_counter() - began, "sweep": sweep}
        del result["what"]
        if strategy.is_main:
            path = Path(out_dir) / RESULT_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"allreduce: {result['bytes'] / 1e6:.1f} MB over {result['communication']} "
                  f"on {env.num_nodes} node(s) x {env.local_world_size}: median "
                  f"{result['median_s'] * 1e3:.2f} ms, busbw {result['busbw_GBps']:.3f} GB/s; "
                  f"{len(sweep)} sizes in {result['probe_s']:.1f} s", flush=True)
        strategy.barrier()
        return result
    finally:
        strategy.teardown()


def _entry(elements: int, what: str, element_size: int, times: list[float], correct: bool,
           world: int) -> dict[str, Any]:
    nbytes = elements * element_size
    median = statistics.median(times)
    algbw = nbytes / median / 1e9
    return {"what": what, "elements": elements, "bytes": nbytes, "iterations": len(times),
            "times_s": times, "median_s": median, "mean_s": statistics.fmean(times),
            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (world - 1) / world,
            "correct": correct}
