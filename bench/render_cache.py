"""Rendering a campaign's scripts with one jinja2 environment per process (hpcdp/render.py
`_environment`, cached) against a fresh environment per script (how it was before: every
render compiled base.sbatch.j2 and the strategy's template again).

Both cases plan the paper campaign on the generic GPU profile in this process
(`campaign.plan`: every cell's script rendered, nothing written), alternating; the ratio of
the medians is printed with the per-round range.

    python bench/render_cache.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

sys.path.insert(0, str(_common.ROOT))

from hpcdp import campaign, config, render  # noqa: E402


def plan_seconds(fresh_environment: bool) -> float:
    profile = config.load_profile("generic-gpu", {"gpu_type": "a100"})
    experiment = config.load_experiment("paper", {})
    cached = render._environment
    cached()  # warm, as in a process after its first script
    if fresh_environment:
        render._environment = cached.__wrapped__  # a new environment for every script
    start = time.perf_counter()
    try:
        campaign.plan(profile, experiment)
    finally:
        render._environment = cached
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    values = _common.interleaved({"one environment (cached)": lambda: plan_seconds(False),
                                  "fresh environment per script": lambda: plan_seconds(True)},
                                 args.rounds)
    cells = len(campaign.plan(config.load_profile("generic-gpu", {"gpu_type": "a100"}),
                              config.load_experiment("paper", {})).cells)
    _common.print_table(f"campaign.plan of the paper campaign ({cells} cells), {args.rounds} "
                        "rounds", _common.ratio_rows(values, "one environment (cached)"),
                        "time against the cached environment")


if __name__ == "__main__":
    main()
