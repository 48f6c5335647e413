"""`python -m train allreduce`: the network baseline of a campaign (hpcdp compare).

Every rank all-reduces a tensor the size of the model's gradient, in the precision gradients
travel in (train.grad_comm), over the strategy's own transport (gloo or NCCL for DDP, Horovod
over MPI or Gloo), as often as it takes to get a stable median. Rank 0 writes
OUT/allreduce.json. Bus bandwidth as nccl-tests defines it: algbw = bytes / time, busbw = algbw
x 2(n-1)/n for n ranks, comparable across rank counts and with the link's speed.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from hpcdp import distenv
from hpcdp import strategies as registry
from hpcdp.config import Experiment
from train.data import expected_vocab_size
from train.model import build_model
from train.strategies import create

RESULT_FILE = "allreduce.json"
WARMUP, ITERATIONS = 3, 10
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def gradient_elements(exp: Experiment) -> int:
    """Parameters of the experiment's model, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = build_model(exp.model.preset, expected_vocab_size(exp.data.tokenizer,
                            exp.data.vocab_size), exp.train.seq_len, 0.0, exp.model.attention)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(exp: Experiment, strategy_name: str, out_dir: str | Path, *,
            expect_world: int | None = None, expect_tasks_per_node: int | None = None
            ) -> dict[str, Any]:
    spec = registry.get(strategy_name)
    env = distenv.detect()
    distenv.check_world(env, expect_world, expect_tasks_per_node)
    torch.set_num_threads(distenv.threads_per_process(env))
    strategy = create(spec, log=print if env.rank == 0 else (lambda _: None))
    strategy.setup(env, exp.train.dist_timeout_s)
    try:
        grad_comm = exp.train.grad_comm if spec.grad_comm else "fp32"
        tensor = torch.ones(gradient_elements(exp), dtype=DTYPES[grad_comm],
                            device=strategy.device)
        times = []
        for i in range(WARMUP + ITERATIONS):
            _sync(strategy.device)
            start = time.perf_counter()
            strategy.all_reduce_(tensor)
            _sync(strategy.device)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
        result = _result(spec.name, strategy.communication, env, tensor, grad_comm, times)
        if strategy.is_main:
            path = Path(out_dir) / RESULT_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(f"allreduce: {result['bytes'] / 1e6:.1f} MB over {result['communication']} "
                  f"on {env.num_nodes} node(s) x {env.local_world_size}: median "
                  f"{result['median_s'] * 1e3:.2f} ms, busbw {result['busbw_GBps']:.3f} GB/s",
                  flush=True)
        strategy.barrier()
        return result
    finally:
        strategy.teardown()


def _result(strategy: str, communication: str, env: distenv.DistEnv, tensor: torch.Tensor,
            grad_comm: str, times: list[float]) -> dict[str, Any]:
    nbytes = tensor.numel() * tensor.element_size()
    median = statistics.median(times)
    n = env.world_size
    algbw = nbytes / median / 1e9
    return {"strategy": strategy, "communication": communication, "nodes": env.num_nodes,
            "world_size": n, "tasks_per_node": env.local_world_size, "grad_comm": grad_comm,
            "elements": tensor.numel(), "bytes": nbytes, "iterations": len(times),
            "times_s": times, "median_s": median, "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (n - 1) / n}
