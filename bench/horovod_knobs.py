"""Issue 11 (item 4): where Horovod's two-node gap to DDP goes, and which knobs close it.

Runs the same two-node smoke job on the local Slurm cluster as distributed-ps (the reference)
and as horovod with one setting changed per case: Horovod's controller (MPI or Gloo), its cycle
time, and Open MPI busy-polling instead of yielding the CPU while it waits. (The MPI
controller with Gloo operations, HOROVOD_CPU_OPERATIONS=gloo, crashed with exit 11 under srun:
not a case.) Cases alternate round
after round, one job at a time (`hpcdp submit --wait`). Prints each case's steady step time
over DDP's, and the median step breakdown (docs/metrics.md: phases_s, exposed_comm_s).

    python bench/horovod_knobs.py [--rounds 2] [--steps 60]

Needs the local cluster (`hpcdp cluster up`) and Horovod (scripts/install-horovod.sh).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402
from overhead import run_settings  # noqa: E402


def _env(name: str, value: str) -> list[str]:
    return [f"cluster.env={{{name}: '{value}'}}"]


CASES = {
    "distributed-ps (gloo)": ("distributed-ps", []),
    "horovod, MPI (hpcdp's default on CPUs: Open MPI yields when idle)": ("horovod", []),
    "horovod, MPI busy-polling (Open MPI's default)": (
        "horovod", _env("OMPI_MCA_mpi_yield_when_idle", "0")),
    "horovod, Gloo controller": ("horovod", ["cluster.horovod_controller=gloo"]),
    "horovod, cycle time 0.1 ms": ("horovod", _env("HOROVOD_CYCLE_TIME", "0.1")),
    "horovod, cycle time 5 ms": ("horovod", _env("HOROVOD_CYCLE_TIME", "5")),
}
PHASES = ("forward", "backward", "sync", "optimizer", "data")
BREAKDOWN: dict[str, list[dict]] = {}


def job(name: str, strategy: str, sets: list[str], steps: int, skip: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-hvd-") as out:
        cmd = [PYTHON, "-m", "hpcdp", "submit", "--strategy", strategy, "--nodes", "2",
               "--experiment", "smoke", "--out", out, "--wait",
               # One allocator for DDP and Horovod alike (auto differs between them on CPUs).
               *[a for s in [*run_settings(steps), "train.malloc=system", *sets]
                 for a in ("--set", s)]]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"bench: {name} failed:\n{done.stdout[-3000:]}\n{done.stderr}")
        (metrics,) = Path(out).rglob("metrics.jsonl")
        steps_ = [r for r in map(json.loads, metrics.read_text().splitlines())
                  if r.get("kind") == "step" and r["step"] >= skip]
        BREAKDOWN.setdefault(name, []).extend(steps_)
        return _common.steady_step_time(metrics, skip)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_timing_arguments(p, rounds=2, steps=60, threads=False)
    args = p.parse_args()
    cases = {name: functools.partial(job, name, strategy, sets, args.steps, args.skip_steps)
             for name, (strategy, sets) in CASES.items()}
    values = _common.interleaved(cases, args.rounds,
                                 progress=lambda line: print(f"  {line}", flush=True))
    reference = next(iter(CASES))
    _common.print_table("Two nodes, one rank each: step time over distributed-ps",
                        _common.ratio_rows(values, reference), "step time ratio")
    print("\nMedian step breakdown, milliseconds (steps logged every 10)\n")
    print(f"| case | step | {' | '.join(PHASES)} | exposed comm |")
    print("|---|---|" + "---|" * (len(PHASES) + 1))
    for name, records in BREAKDOWN.items():
        med = {ph: statistics.median(r["phases_s"][ph] for r in records) * 1e3 for ph in PHASES}
        step = statistics.median(r["step_time_s"] for r in records) * 1e3
        exposed = statistics.median(r["exposed_comm_s"] for r in records) * 1e3
        print(f"| {name} | {step:.1f} | {' | '.join(f'{med[ph]:.1f}' for ph in PHASES)} | "
              f"{exposed:.1f} |")


if __name__ == "__main__":
    main()
