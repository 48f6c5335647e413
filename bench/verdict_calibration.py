"""Is compare's verdict calibrated? Simulated campaigns through the real harvest code.

Each simulated campaign has --cells strategies on one node count, --campaigns times per
(noise model, effect, runs per cell n = 2..10). One strategy is faster by the effect (0, 2, 5,
10%), the others identical; every run's tokens/s is drawn from the noise model. The runs go
through hpcdp.harvest.repeats (cells_of, verdicts: the code `hpcdp harvest` runs) and the
bench counts:

  false   verdicts that call a winner "faster" that is not truly the fastest (at effect 0:
          any "faster" call); the target is at most 5% at every n
  power   verdicts that call the truly fastest "faster" (at effect > 0)
  equiv   verdicts that say "equivalent" (at effect 0 that is the right answer; at 5% and
          10% it would be wrong)

Noise models, each a per-run coefficient of variation (CV): the one measured on the local
cluster (--from a campaign folder: the median per-cell CV of its runs), or --cv, else
MEASURED_CV (recorded in docs/compare.md):
  gaussian   Gaussian with that CV
  heavy      Student t with 3 degrees of freedom, scaled to the same CV (heavier tails)
  outliers   the Gaussian, and one run in ten slowed by 25% (a neighbour, a slow node)

Prints one table per noise model and the smallest n that detects a 5% difference with 80%
power under the measured noise.

    python bench/verdict_calibration.py [--from runs/smoke/compare] [--campaigns 300]
        [--cells 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdp.harvest import collect, repeats  # noqa: E402
from hpcdp.harvest.table import RunResult  # noqa: E402

MEASURED_CV = 0.10
"""Median per-cell CV of per-run tokens/s in a 5-repeat campaign of single-gpu and
distributed-ps on 1 node of the local cluster, 30-step smoke runs (docs/compare.md,
Calibration)."""
EFFECTS = (0.0, 0.02, 0.05, 0.10)
RUNS = range(2, 11)
STRATEGIES = ("single-gpu", "single-ps", "distributed-ps", "horovod", "distributed-ps-apex",
              "horovod-apex")


def measured_cv(folder: Path) -> float:
    """Median over cells of the CV of their runs' tokens/s, read by hpcdp's own harvest."""
    cvs = []
    for cell in collect([folder], query_slurm=False).cells:
        values = cell.values()
        if len(values) > 2:
            mean = sum(values) / len(values)
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            cvs.append(sd / mean)
    if not cvs:
        raise SystemExit(f"verdict_calibration: no cell with 3+ runs under {folder}")
    middle = statistics.median(cvs)
    print(f"measured: per-cell CV of per-run tokens/s in {folder}: median {middle:.2%}, range "
          f"{min(cvs):.2%}-{max(cvs):.2%} over {len(cvs)} cells")
    return middle


def draw(rng: random.Random, model: str, cv: float) -> float:
    """One run's multiplicative noise factor."""
    if model == "heavy":  # t(3) has variance 3: scale to the CV
        z = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
        factor = 1.0 + cv * z / math.sqrt(3.0)
    else:
        factor = 1.0 + rng.gauss(0.0, cv)
        if model == "outliers" and rng.random() < 0.1:
            factor *= 0.75
    return max(factor, 0.05)


def run_result(strategy: str, tokens_per_s: float, repeat: int) -> RunResult:
    """A finished run as harvest's reader would return it: only what the verdict reads."""
    return RunResult(
        run_dir=f"/sim/{strategy}-2n/repeat-{repeat}", experiment="sim", strategy=strategy,
        nodes=2, world_size=4, global_batch=16, precision="fp32", device="cpu",
        communication=None, job_id=None, state="COMPLETED", state_source="log", exit_code=0,
        steps=30, last_step=30, planned_steps=30, segments=1, restarts=0, corrupt_lines=0,
        truncated=False, tokens_per_s=tokens_per_s, step_time_s=1.0 / tokens_per_s,
        steady_steps=25, malloc="tcmalloc", threads=1, cpus=1, source="/sim")


def campaign(rng: random.Random, cells: int, n: int, effect: float, model: str,
             cv: float) -> dict:
    """One simulated campaign's verdict; the first strategy is the faster one."""
    runs = [run_result(s, 1000.0 * (1.0 + (effect if i == 0 else 0.0)) * draw(rng, model, cv),
                       k)
            for i, s in enumerate(STRATEGIES[:cells]) for k in range(1, n + 1)]
    (verdict,) = repeats.verdicts(repeats.cells_of(runs))
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="folder", type=Path,
                        help="a campaign folder whose runs give the measured noise")
    parser.add_argument("--campaigns", type=int, default=300)
    parser.add_argument("--cells", type=int, default=4, choices=range(2, len(STRATEGIES) + 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cv", type=float,
                        help="per-run noise to simulate instead of a measured one, e.g. 0.01")
    args = parser.parse_args()
    cv = args.cv if args.cv else measured_cv(args.folder) if args.folder else MEASURED_CV
    rng = random.Random(args.seed)
    print(f"{args.campaigns} simulated campaigns of {args.cells} strategies per row; noise CV "
          f"{cv:.2%}; false: a wrong 'faster' call, power: the right one, equiv: 'equivalent'")
    detect_5 = None
    worst_false = 0.0
    for model in ("gaussian", "heavy", "outliers"):
        print(f"\nnoise: {model} (CV {cv:.2%})")
        head = ["n", "false@0%", "equiv@0%"] + [f"{k}@{e:.0%}" for e in EFFECTS[1:]
                                                for k in ("power", "false")]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for n in RUNS:
            row = [str(n)]
            for effect in EFFECTS:
                false = power = equiv = 0
                for _ in range(args.campaigns):
                    v = campaign(rng, args.cells, n, effect, model, cv)
                    called = v["outcome"] == "faster"
                    right = called and v["fastest"].startswith(STRATEGIES[0] + " ")
                    false += called and (effect == 0.0 or not right)
                    power += right and effect > 0.0
                    equiv += v["outcome"] == "equivalent"
                def share(k: int) -> str:
                    return f"{k / args.campaigns:.1%}"

                worst_false = max(worst_false, false / args.campaigns)
                if effect == 0.0:
                    row += [share(false), share(equiv)]
                else:
                    row += [share(power), share(false)]
                if model == "gaussian" and effect == 0.05 and detect_5 is None \
                        and power >= 0.8 * args.campaigns:
                    detect_5 = n
            print("| " + " | ".join(row) + " |")
    print(f"\nlargest false-call rate in any row: {worst_false:.1%} (target: at most 5%)")
    print("smallest n detecting a 5% difference with 80% power (gaussian noise, "
          f"{args.cells} strategies): {detect_5 if detect_5 else 'more than 10'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
