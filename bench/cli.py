"""Issue 11 (e): the CLI's start-up, and `hpcdp submit` to RUNNING against plain `sbatch`.

Start-up: `hpcdp --help` and `hpcdp render` (the whole smoke matrix) against the bare
interpreter (`python -c pass`), each a fresh process, alternating.

Submit: the same one-node single-gpu job, submitted by `sbatch` of the script `hpcdp render`
wrote and by `hpcdp submit`, alternating; the time from the command's start until squeue says
RUNNING (polled every 20 ms), then the job is cancelled and gone before the next round. Needs
the local cluster (`hpcdp cluster up`).

    python bench/cli.py [--rounds 10] [--submit-rounds 5] [--no-submit]
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402


def elapsed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def until_running(start: float, job_id: str) -> float:
    """Seconds from `start` until the job runs; then cancel it and wait until it is gone."""
    while True:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                               text=True).stdout.strip()
        if state == "RUNNING":
            seconds = time.perf_counter() - start
            break
        if state not in ("PENDING", "CONFIGURING", ""):
            raise SystemExit(f"bench: job {job_id} went {state} before running")
        time.sleep(0.02)
    subprocess.run(["scancel", job_id], check=True)
    while subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True).stdout.strip():
        time.sleep(0.2)
    return seconds


def by_sbatch(script: str) -> float:
    start = time.perf_counter()
    out = subprocess.run(["sbatch", "--parsable", script], check=True, capture_output=True,
                         text=True).stdout
    return until_running(start, out.strip().split(";")[0])


def by_hpcdp_submit(root: Path, counter: list[int]) -> float:
    counter[0] += 1
    start = time.perf_counter()
    out = subprocess.run([PYTHON, "-m", "hpcdp", "submit", "--strategy", "single-gpu",
                          "--nodes", "1", "--out", str(root / f"submit-{counter[0]}")],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return until_running(start, re.search(r"submitted job (\d+)", out).group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--submit-rounds", type=int, default=5)
    p.add_argument("--no-submit", action="store_true")
    args = p.parse_args()
    from hpcdp import cluster

    os.environ.update(cluster.slurm_env())  # plain sbatch/squeue find the local cluster
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        root = Path(tmp)
        cases = {
            "python -c pass": functools.partial(elapsed, [PYTHON, "-c", "pass"]),
            "hpcdp --help": functools.partial(elapsed, [PYTHON, "-m", "hpcdp", "--help"]),
            "hpcdp render (smoke matrix)": functools.partial(elapsed, [
                PYTHON, "-m", "hpcdp", "render", "--experiment", "smoke", "--cluster", "local",
                "--out", str(root / "render")]),
        }
        values = _common.interleaved(cases, args.rounds)
        _common.print_table("CLI start-up against the bare interpreter",
                            _common.ratio_rows(values, "python -c pass"), "wall time ratio")
        print(f"\n(python -c pass: {statistics.median(values['python -c pass']) * 1e3:.0f} ms "
              "median here)")
        if args.no_submit:
            return
        script = subprocess.run(
            [PYTHON, "-m", "hpcdp", "render", "--strategy", "single-gpu", "--nodes", "1",
             "--cluster", "local", "--out", str(root / "sbatch")], cwd=ROOT, check=True,
            capture_output=True, text=True).stdout.split()[0]
        cases = {"sbatch": functools.partial(by_sbatch, script),
                 "hpcdp submit": functools.partial(by_hpcdp_submit, root, [0])}
        values = _common.interleaved(cases, args.submit_rounds)
        _common.print_table("Submission to RUNNING against plain sbatch of the same script",
                            _common.ratio_rows(values, "sbatch"), "time to RUNNING ratio")
        print(f"\n(sbatch to RUNNING: {statistics.median(values['sbatch']):.2f} s median here)")


if __name__ == "__main__":
    main()
