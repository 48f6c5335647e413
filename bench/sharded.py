"""Issue 20 (6): the sharded strategies against DDP on two local nodes, speed and memory.

One `hpcdp compare` campaign on the local Slurm cluster (distributed-ps, fsdp and zero1 on 2
nodes, one rank each; ZeRO-2 is `--set train.fsdp.reshard_after_forward=false`; --repeats rounds
in a shuffled order, every cell on the same nodes with the same threads and allocator), then
per repeat and as medians: steady seconds per step (bench/_common.py::steady_step_time) of each
sharded strategy over DDP's in the same round, and their state bytes per rank over DDP's.
hsdp is left out: it needs 2 ranks per node, another layout than the others' (2 cores here).

    python bench/sharded.py [--repeats 3] [--steps 40] [--set k=v ...]

Needs the local cluster (`hpcdp cluster up`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

STRATEGIES = ["distributed-ps", "fsdp", "zero1"]


def _state_bytes(metrics: Path) -> int:
    summary = [r for r in map(json.loads, metrics.read_text().splitlines())
               if r["kind"] == "summary"][-1]
    m = summary["memory"]
    return m["params_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip-steps", type=int, default=10)
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    args = p.parse_args()
    sets = [f"matrix.strategies=[{','.join(STRATEGIES)}]", "matrix.nodes=[2]",
            f"train.steps={args.steps}", "train.log_interval=5", "train.eval_interval=0",
            "train.checkpoint_interval=0", "compare.network_baseline=false", *args.sets]
    with _common.local_campaign(sets, args.repeats) as folder:
        runs = {(s, k): folder / f"{s}-2n" / f"repeat-{k}" / "metrics.jsonl"
                for s in STRATEGIES for k in range(1, args.repeats + 1)}
        times = {key: _common.steady_step_time(path, args.skip_steps)
                 for key, path in runs.items()}
        state = {key: _state_bytes(path) for key, path in runs.items()}
    repeats = range(1, args.repeats + 1)
    print(f"bench/sharded.py: one campaign, 2 nodes x 1 rank, {args.repeats} repeats, "
          f"{args.steps} steps per cell (timed from step {args.skip_steps})\n")
    print("| strategy | throughput / DDP's, median | per repeat | state per rank / DDP's |")
    print("|---|---|---|---|")
    for s in STRATEGIES[1:]:
        speed = [times["distributed-ps", k] / times[s, k] for k in repeats]
        memory = state[s, 1] / state["distributed-ps", 1]
        print(f"| {s} | {statistics.median(speed):.3f} | "
              f"{', '.join(f'{r:.3f}' for r in speed)} | {memory:.2f} |")


if __name__ == "__main__":
    main()
