"""How `python -m train` ends: with main's code, after the exit handlers, without Python's
finalization (train/__main__.py exit_without_finalizing).

Why it matters: a gloo worker thread that releases the last collective's tensors while the
interpreter finalizes aborts the process (SIGABRT after a finished run: the job ends FAILED).
That race is too rare to provoke on demand (2 in 62 runs on loaded cores), so these tests check
the mechanism that closes it: an object that only finalization would destroy is never
destroyed, while atexit handlers (loggers, trackers' own, Horovod's) still run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Loaded by `site` at start-up (first on PYTHONPATH): it marks what ran at exit.
SITECUSTOMIZE = '''
import atexit, os, threading, time
MARKS = os.environ["HPCDP_TEST_MARKS"]

def _mark(name, marks=MARKS, create=os.open, close=os.close, flags=os.O_CREAT | os.O_WRONLY):
    # Everything bound now: late in finalization even builtins such as open are gone.
    close(create(marks + "/" + name, flags))

class _LeftForFinalization:
    """Referenced by this module until module teardown: only finalization destroys it."""
    def __del__(self, mark=_mark):
        mark("finalized")

_kept = _LeftForFinalization()
atexit.register(_mark, "atexit")

def _late_writer():  # a non-daemon thread: a normal exit waits for it
    time.sleep(0.5)
    _mark("thread")

threading.Thread(target=_late_writer).start()

# An executor left running, as torch.compile's is: its idle workers are non-daemon threads that
# stop only when threading's exit callbacks tell them to, so a plain join of them never returns.
import concurrent.futures
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
_pool.submit(_mark, "pool")
'''


def _train(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    hooks, marks = tmp_path / "hooks", tmp_path / "marks"
    hooks.mkdir()
    marks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "HPCDP_TEST_MARKS": str(marks),
           "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "train", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return done, {p.name for p in marks.iterdir()}


@pytest.mark.parametrize("argv, code", [
    (["prepare", "--experiment", "smoke", "--set", "data.corpus=synthetic"], 0),
    (["--experiment", "smoke", "--strategy", "no-such-strategy", "--out", "x"], 2),
])
def test_train_exits_with_mains_code_after_exit_handlers_without_finalization(
        tmp_path, argv, code):
    done, marks = _train(tmp_path, *argv)
    assert done.returncode == code, done.stderr
    assert marks == {"atexit", "thread", "pool"}, marks  # "finalized" would mean finalization ran
    if code == 2:
        assert done.stderr.count("\n") == 1 and "no-such-strategy" in done.stderr


def test_the_marks_show_finalization_where_python_finalizes(tmp_path):
    """The control: the same hooks under a plain `python -c` do see finalization, so the test
    above can tell the two exits apart."""
    hooks, marks = tmp_path / "hooks", tmp_path / "marks"
    hooks.mkdir()
    marks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "HPCDP_TEST_MARKS": str(marks), "PYTHONPATH": str(hooks)}
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    assert {p.name for p in marks.iterdir()} == {"atexit", "thread", "pool", "finalized"}
