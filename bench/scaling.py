"""Issue 11 (b): two ranks on two local nodes against one rank, DDP and Horovod, and Horovod
against DDP on two nodes.

It runs the product's own fair comparison: one `hpcdp compare` campaign on the local Slurm
cluster (distributed-ps and horovod, 1 and 2 nodes, --repeats rounds in a shuffled order, every
cell on the same nodes with the same threads per rank), then reads each cell's steady step time
(bench/_common.py::steady_step_time) and prints, per repeat and as medians:

- scaling efficiency: tokens/s on 2 nodes / (2 x tokens/s on 1 node), per strategy (weak
  scaling: the per-rank batch is the same);
- Horovod / DDP: tokens/s of horovod on 2 nodes over distributed-ps on 2 nodes.

    python bench/scaling.py [--repeats 3] [--steps 60] [--set k=v ...]

Needs the local cluster (`hpcdp cluster up`) and Horovod (scripts/install-horovod.sh).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

STRATEGIES = ["distributed-ps", "horovod"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip-steps", type=int, default=10)
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    p.add_argument("--out", type=Path, help="keep the campaign here (default: a temporary "
                   "folder, deleted at the end)")
    args = p.parse_args()
    sets = [f"matrix.strategies=[{','.join(STRATEGIES)}]", "matrix.nodes=[1,2]",
            f"train.steps={args.steps}", "train.log_interval=10", "train.eval_interval=0",
            "train.checkpoint_interval=0",
            # One allocator for both: auto would give DDP's CPU ranks tcmalloc and Horovod's
            # MPI ranks glibc's malloc (train/malloc.py).
            "train.malloc=system", *args.sets]
    with _common.local_campaign(sets, args.repeats, args.out) as folder:
        times = {(s, n): [_common.steady_step_time(folder / f"{s}-{n}n" / f"repeat-{k}" /
                                                   "metrics.jsonl", args.skip_steps)
                          for k in range(1, args.repeats + 1)]
                 for s in STRATEGIES for n in (1, 2)}
    print(f"bench/scaling.py: one campaign, {args.repeats} repeats, {args.steps} steps per cell "
          f"(timed from step {args.skip_steps})\n")
    print("| ratio | median | per-repeat |")
    print("|---|---|---|")
    for s in STRATEGIES:
        # Two ranks process twice the tokens of one per step (weak scaling).
        eff = [t1 / t2 for t1, t2 in zip(times[s, 1], times[s, 2])]
        print(f"| {s}: 2 nodes / (2 x 1 node) | {statistics.median(eff):.3f} | "
              f"{', '.join(f'{e:.3f}' for e in eff)} |")
    ratio = [d / h for h, d in zip(times["horovod", 2], times["distributed-ps", 2])]
    print(f"| horovod / distributed-ps, 2 nodes | {statistics.median(ratio):.3f} | "
          f"{', '.join(f'{r:.3f}' for r in ratio)} |")


if __name__ == "__main__":
    main()
