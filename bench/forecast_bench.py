"""How long `hpcdp forecast` takes on a big campaign: 100 cells (run folders of 200 steps each),
two probes, forecast to 1-1024 nodes. Issue 34 asks for under 2 s.

Writes the campaign into a temporary folder (the metrics schema of docs/metrics.md, plausible
numbers), then times in this process, interleaved round after round:
  read      hpcdp.harvest.collect over the folder (what the forecast reads first)
  forecast  hpcdp.forecast.make over the same folder, 11 node counts (read included)
and prints the median of each, the forecast's ratio to the read, and whether it is under 2 s.

    python bench/forecast_bench.py [--cells 100] [--steps 200] [--rounds 5]
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

from bench._common import interleaved  # noqa: E402
from hpcdp import forecast, harvest  # noqa: E402
from hpcdp.config import as_dict, load_experiment  # noqa: E402

STRATEGIES = ("distributed-ps", "horovod", "fsdp", "zero1", "hsdp")


def write_campaign(root: Path, cells: int, steps: int) -> None:
    rng = random.Random(0)
    config = as_dict(load_experiment("smoke"))
    made = 0
    nodes = 1
    while made < cells:
        for strategy in STRATEGIES:
            run = root / f"{strategy}-{nodes}n" / "repeat-1"
            run.mkdir(parents=True)
            step_s = 0.1 * (1 + 0.05 * nodes.bit_length())
            lines = [{"kind": "header", "strategy": strategy, "precision": "fp32",
                      "world_size": nodes * 2, "nodes": nodes, "tasks_per_node": 2,
                      "n_params": 446_848, "seq_len": 128, "micro_batch_size": 8,
                      "grad_accum_steps": 1, "scaling": "weak", "global_batch_size": 16 * nodes,
                      "tokens_per_step": 2048 * nodes, "communication": "gloo",
                      "grad_bytes_per_step": 1_787_392, "config": config, "device": "cpu"}]
            for step in range(1, steps + 1):
                t = step_s * rng.uniform(0.95, 1.05)
                lines.append({"kind": "step", "step": step, "loss": 5.5, "step_time_s": t,
                              "tokens_per_s": 2048 * nodes / t, "exposed_comm_s": 0.01,
                              "phases_s": {"forward": t / 3, "backward": t / 2},
                              "elapsed_s": step * t})
            lines.append({"kind": "summary", "status": "completed", "steps": steps,
                          "memory": {"peak_bytes": 5e8, "params_bytes": 1.8e6,
                                     "grads_bytes": 1.8e6, "optimizer_bytes": 3.6e6}})
            (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            made += 1
            if made == cells:
                break
        nodes *= 2
    sweep = [{"bytes": 1024 * 4 ** k, "median_s": 3e-4 + 1024 * 4 ** k / 1.5e9}
             for k in range(9)]
    for n in (1, 2):
        probe = root / "baseline" / f"distributed-ps-{n}n"
        probe.mkdir(parents=True)
        (probe / "allreduce.json").write_text(json.dumps(
            {"communication": "gloo", "nodes": n, "world_size": 2 * n, "median_s": 1e-3,
             "bytes": 1_787_392, "sweep": sweep}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=100)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "campaign"
        write_campaign(root, args.cells, args.steps)
        nodes = forecast.parse_nodes("1-1024")

        def timed(fn):
            def run() -> float:
                start = time.perf_counter()
                fn()
                return time.perf_counter() - start
            return run

        values = interleaved({
            "read": timed(lambda: harvest.collect([root], query_slurm=False)),
            "forecast": timed(lambda: forecast.make(str(root), nodes=nodes, query_slurm=False)),
        }, args.rounds)
    read = sorted(values["read"])[len(values["read"]) // 2]
    fc = sorted(values["forecast"])[len(values["forecast"]) // 2]
    print(f"{args.cells} cells x {args.steps} steps, forecast to {len(nodes)} node counts "
          f"(1-1024), {args.rounds} rounds")
    print(f"read (harvest.collect): median {read:.3f} s")
    print(f"forecast (read included): median {fc:.3f} s, {fc / read:.2f}x the read; "
          f"{'under' if fc < 2 else 'OVER'} the 2 s asked")
    return 0 if fc < 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
