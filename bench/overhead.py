"""Issue 11 (a): each strategy at world size 1 against a minimal hand-written loop.

Same model, data, precision and threads: fp32 strategies against bench/minimal_loop.py in fp32,
the -apex strategies against it in bf16 (autocast on the CPU). One round of a strategy is one
process, started by the strategy's own local launcher (python, torchrun, horovodrun, as `hpcdp
run` does), that runs the minimal loop, then hpcdp's real entry point (`train.loop.run`, the
whole loop: logging, stop agreement, watchdog), then the minimal loop again. The number compared
is seconds per step in the steady state; the ratio is hpcdp's over the mean of the two minimal
runs around it, so what one process happens to get from the machine (memory placement, a noisy
neighbour) is on both sides. Rounds of the strategies alternate; medians are printed.

Every process runs with the allocator `--malloc` names (train.malloc's values; default auto, as
training runs). With glibc's (`--malloc system`) the same step takes 0.93x to 1.10x itself from
one process to the next, so its ratios need many more rounds (docs/performance.md).

    python bench/overhead.py [--models tiny,gpt2-124m] [--rounds 5] [--steps 60] [--threads 2]
                             [--malloc auto|tcmalloc|jemalloc|system]

gpt2-124m runs at seq_len 256 and micro-batch 1 (a few seconds per step on 2 cores).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402

FP32 = ["single-gpu", "single-ps", "distributed-ps", "horovod", "fsdp", "zero1"]  # hsdp: 2+ ranks
BF16 = ["distributed-ps-apex", "horovod-apex", "fsdp-apex"]
MODEL_SETTINGS = {
    "tiny": [],
    "gpt2-124m": ["model.preset=gpt2-124m", "train.seq_len=256", "train.micro_batch_size=1"],
}


def log_interval(steps: int) -> int:
    """Every 10 steps, as by default; every step for short runs of big models (which need two
    step records after the skipped ones, and whose steps dwarf a log line)."""
    return 10 if steps >= 40 else 1


def run_settings(steps: int) -> list[str]:
    return [f"train.steps={steps}", f"train.log_interval={log_interval(steps)}",
            "train.eval_interval=0", "train.checkpoint_interval=0"]


def worker(strategy: str, sets: list[str], steps: int, skip: int, out: Path) -> None:
    """Inside the launched process: minimal, hpcdp, minimal; prints the three step times."""
    from bench.minimal_loop import MinimalLoop
    from hpcdp import config
    from hpcdp import strategies as registry
    from train import loop
    from train.precision import resolve_dtype

    exp = config.load_experiment("smoke", config.parse_overrides(sets + run_settings(steps)))
    spec = registry.get(strategy)
    precision = resolve_dtype(spec.mixed_precision, exp.train.amp_dtype, "cpu")
    minimal = MinimalLoop(exp, precision, log_interval=log_interval(steps))
    before = minimal.step_time(steps, skip)
    loop.run(exp, strategy, out, log=lambda line: None)
    after = minimal.step_time(steps, skip)
    if int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0"))) == 0:
        hpcdp = _common.steady_step_time(out / "metrics.jsonl", skip)
        print(json.dumps({"minimal": [before, after], "hpcdp": hpcdp}), flush=True)


def one_round(strategy: str, sets: list[str], steps: int, skip: int, env: dict) -> float:
    """One process of `strategy`: hpcdp's step time over the minimal loop's."""
    from hpcdp import strategies as registry
    from hpcdp.local_run import launch_command

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as out:
        args = ["--worker", strategy, "--out", out, "--steps", str(steps),
                "--skip-steps", str(skip), *[a for s in sets for a in ("--set", s)]]
        cmd = launch_command(registry.get(strategy), 1, PYTHON, args,
                             program=(str(Path(__file__).resolve()),))
        result = _common.run_json(cmd, env=env, timeout=3600)
    return result["hpcdp"] / statistics.mean(result["minimal"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny", help="comma-separated: tiny, gpt2-124m")
    _common.add_timing_arguments(p, rounds=5, steps=60)
    p.add_argument("--strategies", default=",".join(FP32 + BF16))
    p.add_argument("--malloc", default="auto", choices=["auto", "tcmalloc", "jemalloc", "system"],
                   help="the C allocator of every process (train.malloc)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--set", action="append", default=[], dest="sets", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.sets, args.steps, args.skip_steps, args.out)
        return
    from train import malloc

    env = {"OMP_NUM_THREADS": str(args.threads), **malloc.preload_env(args.malloc)}
    # The data once, before anything is timed.
    subprocess.run([PYTHON, "-m", "train", "prepare", "--experiment", "smoke"], cwd=ROOT,
                   check=True, capture_output=True)
    print(f"bench/overhead.py: {args.rounds} rounds, {args.steps} steps per loop (timed from "
          f"step {args.skip_steps}), {args.threads} thread(s) per process, malloc "
          f"{malloc.choose(args.malloc)[0]}")
    chosen = args.strategies.split(",")
    for model in args.models.split(","):
        cases = {name: functools.partial(one_round, name, MODEL_SETTINGS[model], args.steps,
                                         args.skip_steps, env)
                 for name in FP32 + BF16 if name in chosen}
        ratios = _common.interleaved(cases, args.rounds,
                                     progress=lambda line: print(f"  {line}", flush=True))
        print(f"\n{model}: step time of hpcdp over the minimal loop in the same process "
              "(fp32; -apex: bf16)\n")
        print("| strategy | ratio (median) | per-round range |")
        print("|---|---|---|")
        for name, values in ratios.items():
            print(f"| {name} | {statistics.median(values):.3f}x | "
                  f"{min(values):.3f}-{max(values):.3f} |")


if __name__ == "__main__":
    main()
