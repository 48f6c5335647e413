"""What the slowest-of-N term would do to the published series, were their ranks' spread known.

No published table gives each rank's own times, so `forecast.series_checks` assumes no spread
and the term is 0 there (docs/forecast.md). This asks the question the other way round: with
every GPU's work varying by s (one standard deviation, a share of its work, from step to step),
how far off would the forecast be? It prints, for each assumed s, the published checks' median
error, median |error|, largest |error|, how many above and below, and the intervals' coverage.
It measures nothing and fits nothing: the project's checks keep s = 0, since a spread read off
this table would be a constant fitted to the published figures.

    python bench/forecast_spread.py [--spreads 0,0.005,0.01,0.02,0.03]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hpcdp import forecast  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spreads", default="0,0.005,0.01,0.02,0.03")
    args = parser.parse_args()
    try:
        spreads = [float(s) for s in args.spreads.split(",")]
        if any(not 0 <= s < 1 for s in spreads):
            raise ValueError
    except ValueError:
        parser.error(f"--spreads {args.spreads!r}: give shares from 0 to below 1, e.g. 0,0.01")
    print("assumed spread | median error | median |error| | largest | above / below | coverage")
    for spread in spreads:
        rows = forecast.series_checks(rank_spread=spread or None)
        s = forecast.series_summary(rows)
        median = statistics.median(r["error"] for r in rows)
        print(f"{spread:14.1%} | {median:+12.1%} | {s['median_abs_error']:14.1%} | "
              f"{s['largest_abs_error']:7.1%} | {s['above']:5d} / {s['below']:<5d} | "
              f"{s['coverage']:.0%}")


if __name__ == "__main__":
    main()
