"""What every bench/ script shares: interleaved rounds, medians, ratios, subprocesses.

Machines here are shared and noisy, so a benchmark never prints an absolute time alone: it runs
its cases A, B, ... in turn, round after round (the order rotates each round, so no case always
runs first), takes each case's median, and prints ratios against a named reference, with the
spread of the per-round ratios.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def add_timing_arguments(p, *, rounds: int, steps: int, skip_steps: int = 10,
                         threads: bool = True) -> None:
    """--rounds, --steps and --skip-steps (and --threads): how every timing bench runs."""
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--skip-steps", type=int, default=skip_steps)
    if threads:
        p.add_argument("--threads", type=int, default=os.cpu_count() or 1)


def interleaved(cases: Mapping[str, Callable[[], float]], rounds: int,
                progress: Callable[[str], None] = lambda line: None) -> dict[str, list[float]]:
    """Run every case once per round, in an order that rotates each round; each call returns
    the number measured (seconds). Returns every case's values, in round order."""
    names = list(cases)
    values: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            values[name].append(cases[name]())
            progress(f"round {r + 1}/{rounds}: {name} {values[name][-1]:.4g}")
    return values


def ratio_rows(values: Mapping[str, list[float]],
               reference: str) -> list[tuple[str, float, float, float]]:
    """(case, ratio of medians, lowest and highest per-round ratio) of each case's times
    against `reference`'s: 1.05 is 5% slower than the reference."""
    ref = values[reference]
    rows = []
    for name, vals in values.items():
        per_round = [v / r for v, r in zip(vals, ref)]
        rows.append((name, statistics.median(vals) / statistics.median(ref),
                     min(per_round), max(per_round)))
    return rows


def print_table(title: str, rows: list[tuple[str, float, float, float]], what: str) -> None:
    """One markdown table: what each ratio is, its median and the per-round range."""
    print(f"\n{title}\n")
    print(f"| case | {what} (median) | per-round range |")
    print("|---|---|---|")
    for name, median, low, high in rows:
        print(f"| {name} | {median:.3f}x | {low:.3f}-{high:.3f} |")


def run_json(cmd: list[str], env: Mapping[str, str] | None = None, timeout: float = 1800,
             cwd: Path = ROOT) -> dict:
    """Run a command whose last JSON line of output is its result; return it (fail loudly)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    # horovodrun prefixes each line of a rank's output ("[0]<stdout>:").
    last = [line for line in done.stdout.splitlines() if "{" in line][-1]
    return json.loads(last[last.index("{"):])


def steady_step_time(metrics: Path, skip_steps: int) -> float:
    """Seconds per step of an hpcdp run, from its metrics.jsonl: the wall time between the
    step record of step `skip_steps` and the last one, over the steps in between. elapsed_s
    is read when a step is logged, so everything the loop does between steps (logging, the stop
    agreement, the watchdog) is inside it."""
    steps = [r for r in map(json.loads, metrics.read_text().splitlines())
             if r.get("kind") == "step" and r["step"] >= skip_steps]
    if len(steps) < 2:
        raise SystemExit(f"bench: {metrics} has fewer than two step records after step "
                         f"{skip_steps}; run more steps")
    first, last = steps[0], steps[-1]
    return (last["elapsed_s"] - first["elapsed_s"]) / (last["step"] - first["step"])


@contextlib.contextmanager
def local_campaign(sets: list[str], repeats: int, out: Path | None = None) -> Iterator[Path]:
    """One `hpcdp compare` campaign of the smoke experiment on the local cluster, waited for;
    yields its folder (under `out`, else a temporary folder deleted afterwards)."""
    with tempfile.TemporaryDirectory(prefix="bench-campaign-") as tmp:
        root = str(out or tmp)
        cmd = [PYTHON, "-m", "hpcdp", "compare", "--experiment", "smoke", "--repeats",
               str(repeats), "--out", root, "--wait", *[a for s in sets for a in ("--set", s)]]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"bench: the campaign failed:\n{done.stdout[-3000:]}\n{done.stderr}")
        yield next(Path(root).rglob("campaign.json")).parent
