"""The forecast's held-out check on the local cluster, on a quiet machine (docs/forecast.md):
at each link rate, a campaign of distributed-ps, horovod, fsdp and zero1 with 2 ranks per node
on 1 and 2 nodes; the forecast fitted on its 1-node cells and probes predicts the 2-node cells.
Prints, per rate and strategy, the prediction with its interval, the measured median with its
range, the error, and whether it holds (within 15% of the median, or inside the range); and the
campaign's own network probe (gloo's all-reduce at its largest size, before the cells): across
2 nodes as a share of the link's rate (docs/local-cluster.md: within 10%), and within one node
as a multiple of that (at least 5x).

    python bench/forecast_held_out.py [--rates 1gbit,250mbit] [--repeats 3] [--steps 20]
                                      [--probe-max-mb 16] [--set KEY=VALUE ...]

Needs the local cluster (`hpcdp cluster up`) with its node network, and the machine to itself:
the test suite makes a looser check of the same kind beside its other tests
(tests/integration/test_forecast_held_out.py). The links are set back to the default at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HPCDP = [sys.executable, "-m", "hpcdp"]
STRATEGIES = "distributed-ps,horovod,fsdp,zero1"


def campaign(out: Path, repeats: int, steps: int, probe_max_mb: float,
             extra: list[str]) -> Path:
    # The probe's largest message: the local profile's 4 MiB keeps the suite quick; a link's
    # rate is read from large messages, where a collective's fixed costs are a small share.
    sets = [f"matrix.strategies=[{STRATEGIES}]", "matrix.nodes=[1,2]", f"train.steps={steps}",
            "train.eval_interval=0", "train.checkpoint_interval=0", "cluster.partition=gpu",
            "cluster.cpu_ranks_per_node=2", "train.micro_batch_size=4",
            f"cluster.env.HPCDP_ALLREDUCE_MAX_MB={probe_max_mb:g}", *extra]
    done = subprocess.run([*HPCDP, "compare", "--out", str(out), "--repeats", str(repeats),
                           *[a for s in sets for a in ("--set", s)], "--wait"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"forecast_held_out: the campaign failed:\n{done.stdout}{done.stderr}")
    return Path(re.search(r"run:\s+(\S.*)", done.stdout).group(1).strip())


def link_gbytes(rate: str) -> float | None:
    """A tc rate (1gbit, 250mbit) in GB/s; None for none/default (not a known figure here)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate)
    return float(match[1]) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[match[2]] / 8e9 \
        if match else None


def network_lines(folder: Path, rate: str) -> list[str]:
    """The start probes of DDP's transport (gloo) at their largest size, on 1 and 2 nodes."""
    result = json.loads(subprocess.run([*HPCDP, "harvest", str(folder), "--format", "json",
                                        "--no-plots"], capture_output=True, text=True,
                                       check=True).stdout)
    largest = {}
    for probe in result["baseline"]:
        if probe.get("when") == "start" and probe.get("communication") == "gloo":
            sweep = probe.get("sweep") or [probe]
            top = max(sweep if isinstance(sweep, list) else [sweep], key=lambda e: e["bytes"])
            largest[probe["nodes"]] = (top["bytes"], top["busbw_GBps"])
    if 1 not in largest or 2 not in largest:
        return ["  network: no gloo probe on both 1 and 2 nodes"]
    (size, across), (_, within) = largest[2], largest[1]
    link = link_gbytes(rate)
    share = f" = {across / link:.0%} of the link's {link:.3f} GB/s" if link else ""
    return [f"  network: gloo all-reduce of {size / 2**20:.0f} MiB across 2 nodes "
            f"{across:.3f} GB/s{share}; within 1 node {within:.3f} GB/s = "
            f"{within / across:.1f}x across"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="1gbit,250mbit")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--probe-max-mb", type=float, default=16)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="another setting of every campaign (hpcdp compare --set)")
    args = p.parse_args()
    try:
        for rate in args.rates.split(","):
            subprocess.run([*HPCDP, "cluster", "link", "--rate", rate], check=True,
                           capture_output=True)
            folder = campaign(Path(tempfile.mkdtemp(prefix=f"held-out-{rate}-")), args.repeats,
                              args.steps, args.probe_max_mb, args.set)
            result = json.loads(subprocess.run(
                [*HPCDP, "forecast", str(folder), "--fit-nodes", "1", "--nodes", "2",
                 "--format", "json"], capture_output=True, text=True, check=True).stdout)
            print(f"{rate} ({folder}):")
            print("\n".join(network_lines(folder, rate)))
            for p_ in result["predictions"]:
                low, high = p_["measured_range"]
                error = p_["tokens_per_s"] / p_["measured"] - 1
                holds = abs(error) <= 0.15 or low <= p_["tokens_per_s"] <= high
                print(f"  {p_['strategy']:15s} predicted {p_['tokens_per_s']:8.0f} "
                      f"[{p_['tokens_per_s_low']:.0f}-{p_['tokens_per_s_high']:.0f}]  measured "
                      f"{p_['measured']:8.0f} [{low:.0f}-{high:.0f}]  {error:+.1%}  "
                      f"{'holds' if holds else 'MISSES'}")
    finally:
        subprocess.run([*HPCDP, "cluster", "link", "--rate", "default"], capture_output=True)


if __name__ == "__main__":
    main()
