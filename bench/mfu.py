"""Issue 11 (c): model FLOPs utilisation against a peak measured in the same run.

The peak is what this machine does on a large matmul (--matmul N x N, torch.mm) in fp32 and in
bf16; the training figure is hpcdp's own (`hpcdp run --ranks 1`: single-gpu in fp32,
distributed-ps-apex in bf16) in FLOPs per second, from the header's flops_per_token (6N +
12 L d T) times tokens per step over the steady step time. Peak and training runs alternate
round after round, each a fresh process with the same threads; MFU = training / peak, per round
and as the ratio of medians.

    python bench/mfu.py [--model tiny|gpt2-124m] [--rounds 3] [--matmul 2048]
    python bench/mfu.py --peak fp32|bf16 [--matmul 2048]   (one peak measurement, JSON)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402
from overhead import MODEL_SETTINGS, run_settings  # noqa: E402

TRAINING = {"fp32": "single-gpu", "bf16": "distributed-ps-apex"}


def hpcdp_step(strategy: str, sets: list[str], steps: int, skip: int,
               env: dict) -> tuple[float, dict]:
    """Steady seconds per step of one fresh `hpcdp run --ranks 1`, and its metrics header."""
    with tempfile.TemporaryDirectory(prefix="bench-mfu-") as out:
        cmd = [PYTHON, "-m", "hpcdp", "run", "--strategy", strategy, "--ranks", "1",
               "--experiment", "smoke", "--out", out,
               *[a for s in sets + run_settings(steps) for a in ("--set", s)]]
        subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, check=True,
                       capture_output=True, timeout=3600)
        (metrics,) = Path(out).rglob("metrics.jsonl")
        header = json.loads(metrics.read_text().splitlines()[0])
        return _common.steady_step_time(metrics, skip), header


def measure_peak(dtype_name: str, n: int, iters: int = 10) -> dict:
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.mm(a, b)
    seconds = (time.perf_counter() - t0) / iters
    return {"seconds": seconds, "flops": 2 * n ** 3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peak", choices=list(TRAINING))
    p.add_argument("--matmul", type=int, default=2048)
    p.add_argument("--model", default="tiny", choices=list(MODEL_SETTINGS))
    _common.add_timing_arguments(p, rounds=3, steps=30)
    args = p.parse_args()
    if args.peak:
        print(json.dumps(measure_peak(args.peak, args.matmul)))
        return
    env = {"OMP_NUM_THREADS": str(args.threads)}
    sets = MODEL_SETTINGS[args.model]
    flops: dict[str, float] = {}  # FLOPs of one case's unit of work (a matmul, a step)

    def peak(dtype: str) -> float:
        result = _common.run_json([PYTHON, __file__, "--peak", dtype, "--matmul",
                                   str(args.matmul)], env=env)
        flops[f"peak {dtype}"] = result["flops"]
        return result["seconds"]

    def training(dtype: str) -> float:
        seconds, header = hpcdp_step(TRAINING[dtype], sets, args.steps, args.skip_steps, env)
        flops[f"train {dtype}"] = header["flops_per_token"] * header["tokens_per_step"]
        return seconds

    cases = {}
    for dtype in TRAINING:
        cases[f"peak {dtype}"] = functools.partial(peak, dtype)
        cases[f"train {dtype}"] = functools.partial(training, dtype)
    values = _common.interleaved(cases, args.rounds,
                                 progress=lambda line: print(f"  {line}", flush=True))
    print(f"\nbench/mfu.py: {args.model}, {args.rounds} rounds, matmul {args.matmul}, "
          f"{args.threads} thread(s)\n")
    print("| precision | training GFLOP/s | peak GFLOP/s | MFU (median) | per round |")
    print("|---|---|---|---|---|")
    for dtype in TRAINING:
        train_s, peak_s = values[f"train {dtype}"], values[f"peak {dtype}"]
        rate = flops[f"train {dtype}"] / statistics.median(train_s)
        top = flops[f"peak {dtype}"] / statistics.median(peak_s)
        per_round = [(flops[f"train {dtype}"] / t) / (flops[f"peak {dtype}"] / q)
                     for t, q in zip(train_s, peak_s)]
        print(f"| {dtype} ({TRAINING[dtype]}) | {rate / 1e9:.1f} | {top / 1e9:.1f} | "
              f"{rate / top:.1%} | {', '.join(f'{m:.1%}' for m in per_round)} |")


if __name__ == "__main__":
    main()
