"""Issue 11: the C allocator (train.malloc) and why glibc's made the overhead figures unsteady.

In one process, the minimal loop's step and hpcdp's `train_step` alternate on the same model,
optimizer and batches (--rounds blocks each); the ratio of their medians is what hpcdp's step
code costs there. Each allocator gets --processes fresh processes, in turns. With glibc's malloc
that ratio is steady within a process but differs from one process to the next: where a step's
tensors land depends on what the process allocated before. With tcmalloc or jemalloc it should
not, and the step is faster; both are printed.

    python bench/allocator.py [--processes 4] [--precision bf16]
                              [--mallocs system,tcmalloc,jemalloc]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common  # noqa: E402
from _common import PYTHON  # noqa: E402


def worker(precision: str, steps: int, skip: int, rounds: int) -> None:
    """Inside one process: minimal step and hpcdp's train_step in turns; prints the ratio."""
    from bench.minimal_loop import MinimalLoop
    from hpcdp import config, distenv
    from hpcdp import strategies as registry
    from train.loop import train_step
    from train.precision import make_precision
    from train.strategies import create

    exp = config.load_experiment("smoke", config.parse_overrides([]))
    minimal = MinimalLoop(exp, precision)
    strategy = create(registry.get("single-gpu"), log=lambda line: None)
    strategy.setup(distenv.detect(), 60)
    mixed = precision != "fp32"
    amp = make_precision(mixed, precision if mixed else "auto", "native", "cpu")
    batches = types.SimpleNamespace(next_batch=minimal.batch)

    def hpcdp_step_time() -> float:
        for step in range(1, steps + 1):
            if step == skip + 1:
                start = time.perf_counter()
            result = train_step(minimal.model, minimal.optimizer, batches, strategy, amp,
                                accum_steps=1, grad_clip=exp.train.grad_clip, lr=exp.train.lr)
            if step % minimal.log_interval == 0:
                result.loss.item()
        return (time.perf_counter() - start) / (steps - skip)

    times = _common.interleaved({"minimal": lambda: minimal.step_time(steps, skip),
                                 "hpcdp": hpcdp_step_time}, rounds)
    minimal_s = statistics.median(times["minimal"])
    print(json.dumps({"ratio": statistics.median(times["hpcdp"]) / minimal_s,
                      "minimal_s": minimal_s}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=4, help="fresh processes per allocator")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--mallocs", default="system,tcmalloc,jemalloc")
    _common.add_timing_arguments(p, rounds=4, steps=60)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.precision, args.steps, args.skip_steps, args.rounds)
        return
    from train import malloc

    envs = {name: {"OMP_NUM_THREADS": str(args.threads), **malloc.preload_env(name)}
            for name in args.mallocs.split(",") if name == "system" or malloc.find(name)}
    cmd = [PYTHON, str(Path(__file__).resolve()), "--worker", "--precision", args.precision,
           "--steps", str(args.steps), "--skip-steps", str(args.skip_steps),
           "--rounds", str(args.rounds)]
    results: dict[str, list[dict]] = {name: [] for name in envs}
    names = list(envs)
    for r in range(args.processes):  # allocators in turns, the order rotating
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(_common.run_json(cmd, env=envs[name]))
            print(f"  process {r + 1}/{args.processes}: {name} {results[name][-1]}", flush=True)
    reference = statistics.median(x["minimal_s"] for x in results[names[0]])
    print(f"\n{args.precision}, tiny model: hpcdp's train_step over the minimal step, per "
          f"process; the minimal step's time against {names[0]}'s\n")
    print("| malloc | hpcdp / minimal, per process | spread | minimal step time |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        ratios = [x["ratio"] for x in runs]
        speed = statistics.median(x["minimal_s"] for x in runs) / reference
        print(f"| {name} | {', '.join(f'{v:.3f}' for v in ratios)} | "
              f"{max(ratios) - min(ratios):.3f} | {speed:.3f}x |")


if __name__ == "__main__":
    main()
