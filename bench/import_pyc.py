"""A rank's imports with hpcdp's and train's bytecode compiled ahead (what scripts/setup.sh now
does) against the same imports compiled from source in the process, which is what every rank
did where PYTHONDONTWRITEBYTECODE is set (this machine and CI set it): pip compiles what it
installs, but not an editable checkout, and no process writes the bytecode it compiles.

Both cases import a copy of hpcdp/ and train/ in a temporary folder (the first on sys.path),
one with its __pycache__ and one without, with the collector paused as a rank does; the CPU
time is taken as in bench/import_gc.py.

    python bench/import_pyc.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import compileall
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from import_gc import CASES, cpu_seconds  # noqa: E402

IMPORT = CASES["collector paused (without_gc)"]
NO_BYTECODE_WRITTEN = {"PYTHONDONTWRITEBYTECODE": "1"}


def copy_sources(to: Path) -> Path:
    to.mkdir()
    for package in ("hpcdp", "train"):
        shutil.copytree(_common.ROOT / package, to / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return to


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compiled = copy_sources(Path(tmp) / "compiled")
        from_source = copy_sources(Path(tmp) / "from-source")
        for package in ("hpcdp", "train"):
            compileall.compile_dir(compiled / package, quiet=1)
        cases = {"bytecode compiled ahead":
                 lambda: cpu_seconds(IMPORT, compiled, NO_BYTECODE_WRITTEN),
                 "compiled in each process":
                 lambda: cpu_seconds(IMPORT, from_source, NO_BYTECODE_WRITTEN)}
        values = _common.interleaved(cases, args.rounds)
    _common.print_table(f"CPU seconds of a rank's imports, {args.rounds} rounds",
                        _common.ratio_rows(values, "bytecode compiled ahead"),
                        "CPU time against bytecode compiled ahead")


if __name__ == "__main__":
    main()
