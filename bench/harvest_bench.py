"""How fast `hpcdp harvest` reads a big comparison: 100 run dirs x 10,000 step records.

Writes the runs into a temporary directory (schema of docs/architecture.md, plausible numbers),
then times, in the same process:
  parse  plain `json.loads` of every line of every metrics.jsonl (the floor for a reader that
         parses everything)
  harvest  hpcdp.harvest.harvest() over the root (walk, read, segment, medians, comparisons;
         no Slurm query, no plots)
and prints both, per-run milliseconds and the ratio harvest / parse. Best of --repeat runs.

    python bench/harvest_bench.py [--runs 100] [--steps 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdp import strategies  # noqa: E402
from hpcdp.harvest import harvest  # noqa: E402


def write_runs(root: Path, runs: int, steps: int) -> int:
    """`runs` run dirs of `steps` step records each (+ header, evals, summary); total bytes."""
    rng = random.Random(0)
    total = 0
    names = strategies.NAMES
    for i in range(runs):
        strategy = names[i % len(names)]
        nodes = 1 if strategies.get(strategy).max_nodes == 1 else 1 + (i // len(names)) % 4
        world = nodes * (1 if strategies.get(strategy).launch == "one-per-node" else 4)
        run = root / "bench" / f"{strategy}-{nodes}n-{i:03d}"
        run.mkdir(parents=True)
        t0 = 1_800_000_000.0
        header = {"kind": "header", "time": t0, "strategy": strategy, "mechanism": "ddp",
                  "precision": "fp16" if strategy.endswith("apex") else "fp32",
                  "world_size": world, "nodes": nodes, "tasks_per_node": world // nodes,
                  "device": "cuda", "device_name": "NVIDIA H100", "start_step": 0,
                  "slurm_job_id": None, "restart_count": 0, "experiment": "bench",
                  "tokens_per_step": 2048 * world,
                  "config": {"train": {"steps": steps, "warmup_log_steps": 20}}}
        lines = [json.dumps(header)]
        elapsed, loss = 0.0, 10.0
        for step in range(1, steps + 1):
            dt = 0.05 * (1 + 0.1 * rng.random())
            elapsed += dt
            loss = max(2.0, loss * 0.9995)
            lines.append(json.dumps({
                "kind": "step", "time": t0 + elapsed, "step": step,
                "loss": loss + rng.random() * 0.01,
                "lr": 1.5e-4, "grad_norm": 0.8 + rng.random(), "loss_scale": 65536.0,
                "skipped": False, "step_time_s": dt, "tokens_per_s": 2048 * world / dt,
                "tokens_seen": step * 2048 * world, "elapsed_s": elapsed,
                "max_mem_gb": 12.5, "mfu": 0.41}))
            if step % 500 == 0:
                lines.append(json.dumps({"kind": "eval", "time": t0 + elapsed, "step": step,
                                         "val_loss": loss + 0.05}))
        lines.append(json.dumps({"kind": "summary", "time": t0 + elapsed, "status": "completed",
                                 "steps": steps, "final_loss": loss}))
        text = "\n".join(lines) + "\n"
        (run / "metrics.jsonl").write_text(text)
        total += len(text)
    return total


def plain_parse(root: Path) -> int:
    records = 0
    for path in sorted(root.rglob("metrics.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                json.loads(line)
                records += 1
    return records


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harvest-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        size = write_runs(root, args.runs, args.steps)
        print(f"wrote {args.runs} runs x {args.steps} steps ({size / 1e6:.0f} MB) "
              f"in {time.perf_counter() - t0:.1f} s")
        parse_s, records = best_of(args.repeat, lambda: plain_parse(root))
        harvest_s, results = best_of(args.repeat, lambda: harvest([root], query_slurm=False))
        assert len(results) == args.runs and all(r.steps == args.steps for r in results)
        print(f"plain json.loads per line: {parse_s:.2f} s ({records:,} records, "
              f"{parse_s / args.runs * 1e3:.1f} ms/run)")
        print(f"harvest():                 {harvest_s:.2f} s ({harvest_s / args.runs * 1e3:.1f} "
              f"ms/run)")
        print(f"ratio harvest / plain parse: {harvest_s / parse_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
