"""A rank's imports (train.loop: torch, transformers, the strategies) with the cyclic garbage
collector paused (train/imports.py `without_gc`, what `python -m train` does) against the same
imports with it running (how it was before).

Each case is a fresh `python -c` process whose CPU time (user + system, from the kernel's
account of the waited-for child) is taken, so other load on the machine adds no wall time to
it; the cases alternate, and the ratio of the medians is printed with the per-round range.
scipy is hidden as a rank hides it (train/__main__.py `_hide_scipy`).

    python bench/import_gc.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402

IMPORT = "import sys; sys.modules.setdefault('scipy', None)\n"
CASES = {
    "collector paused (without_gc)":
        IMPORT + "from train.imports import without_gc\nwith without_gc():\n"
                 "    from train.loop import run\n",
    "collector running": IMPORT + "from train.loop import run\n",
}


def cpu_seconds(code: str, cwd: Path = _common.ROOT, env: dict[str, str] | None = None) -> float:
    """CPU seconds (user + system) of one fresh interpreter running `code` in `cwd`, with
    `env` added to this environment."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([_common.PYTHON, "-c", code], cwd=cwd, check=True,
                   env=os.environ | {"OMP_NUM_THREADS": "1"} | (env or {}))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    values = _common.interleaved({name: (lambda c=code: cpu_seconds(c))
                                  for name, code in CASES.items()}, args.rounds)
    _common.print_table(f"CPU seconds of a rank's imports, {args.rounds} rounds",
                        _common.ratio_rows(values, "collector paused (without_gc)"),
                        "CPU time against the paused collector")


if __name__ == "__main__":
    main()
