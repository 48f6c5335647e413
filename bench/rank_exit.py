"""How long a rank takes to end: Python's normal exit against train/__main__.py's
exit_without_finalizing, after the imports every rank has (train.loop, train.model: torch and
transformers).

One round is two processes, one of each kind, in alternating order; each writes the time its
work ended, and the seconds from then until the process is gone are its exit time. Medians
over the rounds and their ratio are printed. Finalization is the normal exit's last garbage
collection and module teardown over a few thousand modules; the other exit joins threads and
runs the atexit handlers only.

    python bench/rank_exit.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PYTHON, ROOT  # noqa: E402

CHILD = """
import sys, time
import train.loop, train.model
from train.__main__ import exit_without_finalizing
with open(sys.argv[2], "w") as f:
    f.write(repr(time.time()))
if sys.argv[1] == "normal":
    sys.exit(0)
exit_without_finalizing(0)
"""


def exit_seconds(mode: str, mark: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([PYTHON, "-c", CHILD, mode, str(mark)], cwd=ROOT, env=env, check=True)
    gone = time.time()
    return gone - float(mark.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {"normal": [], "without finalizing": []}
    with tempfile.TemporaryDirectory() as tmp:
        mark = Path(tmp) / "mark"
        for k in range(args.rounds):
            order = ["normal", "without finalizing"][:: 1 if k % 2 == 0 else -1]
            for mode in order:
                seconds[mode].append(exit_seconds(mode.split()[0], mark))
    for mode, values in seconds.items():
        print(f"{mode:>20}: median {statistics.median(values):.3f} s to exit "
              f"(range {min(values):.3f}-{max(values):.3f}, {len(values)} processes)")
    ratio = statistics.median(seconds["without finalizing"]) / statistics.median(seconds["normal"])
    print(f"exit time without finalizing / normal: {ratio:.3f}x")


if __name__ == "__main__":
    main()
