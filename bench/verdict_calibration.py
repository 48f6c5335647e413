"""Is compare's verdict calibrated? Simulated campaigns through the real harvest code.

Each simulated campaign has --cells strategies on one node count, --campaigns times per
(noise model, effect, runs per cell n = 2..10). One strategy is faster by the effect (0, 2, 5,
10%), the others identical; every run's tokens/s is drawn from the noise model. The runs go
through hpcdp.harvest.repeats (cells_of, verdicts: the code `hpcdp harvest` runs) and the
bench counts:

  false   verdicts that call a winner "faster" that is not truly the fastest (at effect 0:
          any "faster" call)
  any     verdicts that print at least one wrong claim, headline or partial: "X ahead of Y"
          where X is not truly faster than Y by more than the band, or "X and Y equally fast"
          (equivalent) where they truly differ by the band or more; the target is at most 5%
          at every n (issue 36, items 8 and 9)
  power   verdicts that call the truly fastest "faster" (at effect > 0)
  equiv   verdicts that say "equivalent" (at effect 0 that is the right answer)

--scenarios measures the two cases of issue 36 instead, with a 95% (Wilson) interval of each
rate: 3-7 identical strategies at CV 10% and 30% with 5 and 10 runs (any wrong claim), and four
strategies, one truly 2% faster (the band's edge), CV 1%, 8 runs (a wrong "equivalent").

Noise models, each a per-run coefficient of variation (CV): the one measured on the local
cluster (--from a campaign folder: the median per-cell CV of its runs), or --cv, else
MEASURED_CV (recorded in docs/compare.md):
  gaussian   Gaussian with that CV
  heavy      Student t with 3 degrees of freedom, scaled to the same CV (heavier tails)
  outliers   the Gaussian, and one run in ten slowed by 25% (a neighbour, a slow node)

Prints one table per noise model and the smallest n that detects a 5% difference with 80%
power under the measured noise.

    python bench/verdict_calibration.py [--from runs/smoke/compare] [--campaigns 300]
        [--cells 4] [--seed 0] [--scenarios]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdp.harvest import collect, repeats, stats  # noqa: E402
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


def wrong_claims(v: dict, effect: float, band: float = stats.EQUIVALENT_WITHIN) -> int:
    """The claims of one verdict that the truth contradicts (every 'faster' and 'equivalent'
    comparison is printed, whatever the headline): STRATEGIES[0] is `effect` faster."""
    def speed(cell: str) -> float:
        return 1.0 + effect if cell.startswith(STRATEGIES[0] + " ") else 1.0

    wrong = 0
    for c in v.get("comparisons", []):
        ratio = speed(v["fastest"]) / speed(c["other"])
        if c["outcome"] == "faster":
            wrong += ratio <= 1.0 + band + 1e-12
        elif c["outcome"] == "equivalent":
            wrong += not 1.0 / (1.0 + band) + 1e-12 < ratio < 1.0 + band - 1e-12
    return wrong


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of a rate k / n."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scenarios(rng: random.Random, campaigns: int) -> None:
    """Issue 36's two cases, each rate with its interval."""
    print(f"{campaigns} simulated campaigns per row (gaussian noise); rate of campaigns with "
          "a wrong claim, [95% interval]")
    print("| strategies, all identical | CV | runs per cell | wrong 'ahead of' |")
    print("|---:|---:|---:|---:|")
    for cells in range(3, 8):
        for cv in (0.10, 0.30):
            for n in (5, 10):
                k = sum(wrong_claims(campaign(rng, cells, n, 0.0, "gaussian", cv), 0.0) > 0
                        for _ in range(campaigns))
                low, high = wilson(k, campaigns)
                print(f"| {cells} | {cv:.0%} | {n} | {k / campaigns:.1%} "
                      f"[{low:.1%}, {high:.1%}] |")
    k = sum(wrong_claims(campaign(rng, 4, 8, 0.02, "gaussian", 0.01), 0.02) > 0
            for _ in range(campaigns))
    low, high = wilson(k, campaigns)
    print(f"\nfour strategies, one 2% faster (the band's edge), CV 1%, 8 runs: a wrong claim in "
          f"{k / campaigns:.1%} [{low:.1%}, {high:.1%}] of campaigns")


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
    parser.add_argument("--scenarios", action="store_true",
                        help="measure issue 36's two cases instead of the tables")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.scenarios:
        scenarios(rng, args.campaigns)
        return 0
    cv = args.cv if args.cv else measured_cv(args.folder) if args.folder else MEASURED_CV
    print(f"{args.campaigns} simulated campaigns of {args.cells} strategies per row; noise CV "
          f"{cv:.2%}; false: a wrong winner, any: any wrong claim (headline or partial), "
          "power: the right winner, equiv: 'equivalent'")
    detect_5, worst = None, 0.0
    for model in ("gaussian", "heavy", "outliers"):
        print(f"\nnoise: {model} (CV {cv:.2%})")
        head = ["n", "false@0%", "any@0%", "equiv@0%", "any@2%"] + [
            f"{k}@{e:.0%}" for e in EFFECTS[2:] for k in ("power", "any")]
        print("| " + " | ".join(head) + " |")
        print("|" + "---:|" * len(head))
        for n in RUNS:
            row = [str(n)]
            for effect in EFFECTS:
                counts = tally([campaign(rng, args.cells, n, effect, model, cv)
                                for _ in range(args.campaigns)], effect)
                share = {k: v / args.campaigns for k, v in counts.items()}
                worst = max(worst, share["any"])
                row += ([share["false"], share["any"], share["equiv"]] if effect == 0.0 else
                        [share["any"]] if effect == 0.02 else [share["power"], share["any"]])
                if model == "gaussian" and effect == 0.05 and detect_5 is None \
                        and share["power"] >= 0.8:
                    detect_5 = n
            print("| " + " | ".join(v if isinstance(v, str) else f"{v:.1%}" for v in row)
                  + " |")
    print(f"\nlargest rate of campaigns with any wrong claim in a row: {worst:.1%} (target: at "
          "most 5%)")
    print("smallest n detecting a 5% difference with 80% power (gaussian noise, "
          f"{args.cells} strategies): {detect_5 if detect_5 else 'more than 10'}")
    return 0


def tally(verdicts: list[dict], effect: float) -> dict[str, int]:
    """How many verdicts called a wrong winner, printed any wrong claim, called the right
    winner, said 'equivalent'."""
    out = {"false": 0, "any": 0, "power": 0, "equiv": 0}
    for v in verdicts:
        called = v["outcome"] == "faster"
        right = called and v["fastest"].startswith(STRATEGIES[0] + " ")
        out["false"] += called and (effect == 0.0 or not right)
        out["any"] += wrong_claims(v, effect) > 0
        out["power"] += right and effect > 0.0
        out["equiv"] += v["outcome"] == "equivalent"
    return out


if __name__ == "__main__":
    sys.exit(main())
