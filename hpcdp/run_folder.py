"""The run folder's names: what hpcdp and train/ write in a run's folder, each named once here
(docs/architecture.md, "Run directory"), and the one reader of its metrics.jsonl. No torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
"""One JSON record per line: a header per segment, steps, evals, a summary (docs/metrics.md)."""
EXPERIMENT_FILE = "experiment.yaml"
"""The experiment as resolved at submission: what the job trains, and what --resume-from reads."""
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_NAME = re.compile(r"step-(\d{7,})\.(pt|dcp)")
"""A checkpoint: its step in seven digits or more, then .pt (one file) or .dcp (sharded)."""


def checkpoint_name(step: int, sharded: bool) -> str:
    return f"step-{step:07d}{'.dcp' if sharded else '.pt'}"


def holds_a_run(run_dir: Path) -> bool:
    """An earlier run wrote here: its metrics or a checkpoint (what hpcdp's commands continue
    or move aside, and what `python -m train` without --resume refuses to start over)."""
    return (run_dir / METRICS_FILE).exists() or any((run_dir / CHECKPOINT_DIR).glob("step-*"))


# ---------------------------------------------------------------- reading metrics.jsonl
# The one reader of the file's lines: every module that reads metrics.jsonl reads it through
# these (harvest adds a faster path for the step lines train/metrics.py writes, which falls back
# to record_of for any other line). A line cut by a kill, or damaged, is skipped, and a whole
# record glued behind a cut prefix is recovered.

TAIL_BYTES = 64 * 1024
"""What a quick look reads of the file's end (status, the finished check): a long run costs no
more than a short one."""


def record_of(line: str) -> dict | None:
    """One line as a record (a JSON object with a "kind"), or None."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "kind" in record else None


def recovered_from(line: str) -> dict | None:
    """A damaged line may be a cut record with a whole one glued after it: that one, or None."""
    start = line.find('{"', 1)
    while start != -1:
        record = record_of(line[start:])
        if record is not None:
            return record
        start = line.find('{"', start + 1)
    return None


def _records(lines: Iterable[str], kinds: tuple[str, ...] | None) -> list[dict]:
    wanted = [f'"{k}"' for k in kinds] if kinds else None
    out = []
    for line in lines:
        if wanted and not any(w in line for w in wanted):
            continue  # cheaper than parsing: a long run's step lines, when only headers matter
        record = record_of(line) or recovered_from(line)
        if record is not None and (not kinds or record["kind"] in kinds):
            out.append(record)
    return out


def metrics_file(path: Path) -> Path:
    """A run folder's metrics.jsonl; a file given as itself."""
    path = Path(path)
    return path / METRICS_FILE if path.is_dir() else path


def read_metrics(path: Path, kinds: tuple[str, ...] | None = None) -> list[dict]:
    """Every record of a run folder's metrics.jsonl (or of that file) in file order, of these
    kinds only where given ("header", "step", "eval", "summary"); [] when there is no file."""
    try:
        with open(metrics_file(path), encoding="utf-8", errors="replace") as f:
            return _records(f, kinds)
    except OSError:
        return []


def head_and_tail(path: Path) -> tuple[dict | None, list[dict]]:
    """The first record (the first segment's header) and the records of the last TAIL_BYTES
    of a run folder's metrics.jsonl (or of that file), without reading what lies between;
    (None, []) when there is no file."""
    try:
        with open(metrics_file(path), "rb") as f:
            head = f.readline().decode("utf-8", "replace")
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None, []
    return record_of(head), _records(tail.splitlines(), None)
