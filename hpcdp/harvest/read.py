"""Reading one run directory: metrics.jsonl (robustly), submission.json, slurm-*.out.

metrics.jsonl is appended by rank 0 and flushed per line, so what can go wrong is what a kill
leaves behind: a last line cut mid-way, or (after a requeue) a cut line with the next
segment's header glued to its end. Such lines are counted and reported, never fatal; a record
hidden behind a cut prefix is recovered. Several `header` records are segments (requeue or
resume); the last record written for a step wins.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp.errors import UsageError

METRICS = "metrics.jsonl"
# Directories that never hold a run's metrics: do not walk into them.
_SKIP_DIRS = {"checkpoints", ".git", "__pycache__", ".venv", "node_modules"}


@dataclass
class Segment:
    """One uninterrupted stretch of training: a header and the records after it."""

    header: dict
    first_step: int | None = None
    last_step: int | None = None
    last_elapsed_s: float = 0.0
    """The last step's elapsed_s: the segment's training time."""
    offset_s: float = 0.0
    """Training time of all earlier segments (the time axis continues across requeues)."""


@dataclass
class MetricsLog:
    """Everything read from one metrics.jsonl."""

    path: Path
    segments: list[Segment] = field(default_factory=list)
    steps: dict[int, dict] = field(default_factory=dict)
    """step -> the last `step` record written for it, plus `_seg` (segment index) and `_t`
    (training time: segment offset + elapsed_s)."""
    evals: dict[int, float] = field(default_factory=dict)
    summary: dict | None = None
    lines: int = 0
    corrupt_lines: int = 0
    recovered_records: int = 0
    """Records found behind a cut prefix on a corrupt line (counted in corrupt_lines too)."""
    truncated: bool = False
    """The file ends in a partial line (the writer was killed mid-write)."""
    last_time: float | None = None

    @property
    def header(self) -> dict:
        """The last segment's header ({} when the file has none)."""
        return self.segments[-1].header if self.segments else {}


def _loads_fused(line: str) -> dict | None:
    """A corrupt line may be a cut record with a whole one glued after it: find that one."""
    start = line.find('{"', 1)
    while start != -1:
        try:
            record = json.loads(line[start:])
        except ValueError:
            start = line.find('{"', start + 1)
            continue
        return record if isinstance(record, dict) and "kind" in record else None
    return None


def _parse_lines(text: str) -> tuple[list[dict], int, int, bool, int]:
    """(records, corrupt lines, recovered records, truncated, line count) of a metrics text."""
    truncated_tail = bool(text) and not text.endswith("\n")
    lines = text.splitlines()
    # Fast path: one json.loads over the whole file as an array (a single C call instead of
    # one per line). Any bad line makes it fail, and then the per-line path finds which.
    body = ",".join(line for line in lines if line.strip())
    try:
        records = json.loads(f"[{body}]")
        if all(isinstance(r, dict) and "kind" in r for r in records):
            return records, 0, 0, False, len(lines)
    except ValueError:
        pass
    records, corrupt, recovered, truncated = [], 0, 0, False
    last_index = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if isinstance(record, dict) and "kind" in record:
                records.append(record)
                continue
        except ValueError:
            pass
        if i == last_index and truncated_tail:
            truncated = True  # the writer died mid-line: expected after a kill, said as such
        else:
            corrupt += 1
        fused = _loads_fused(line)
        if fused is not None:
            records.append(fused)
            recovered += 1
    return records, corrupt, recovered, truncated, len(lines)


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_metrics(path: Path) -> MetricsLog:
    """Read metrics.jsonl; never raises on content (only on an unreadable file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    records, corrupt, recovered, truncated, n_lines = _parse_lines(text)
    log = MetricsLog(path=path, lines=n_lines, corrupt_lines=corrupt,
                     recovered_records=recovered, truncated=truncated)
    segment: Segment | None = None
    offset = 0.0
    for record in records:
        kind = record.get("kind")
        t = _num(record.get("time"))
        if t is not None:
            log.last_time = t
        if kind == "header" or segment is None:
            if segment is not None:
                offset += segment.last_elapsed_s
            segment = Segment(header=record if kind == "header" else {}, offset_s=offset)
            log.segments.append(segment)
            if kind == "header":
                continue
        if kind == "step":
            step = record.get("step")
            if not isinstance(step, int):
                log.corrupt_lines += 1
                continue
            elapsed = _num(record.get("elapsed_s")) or 0.0
            segment.last_elapsed_s = elapsed
            if segment.first_step is None:
                segment.first_step = step
            segment.last_step = step
            record["_seg"] = len(log.segments) - 1
            record["_t"] = segment.offset_s + elapsed
            log.steps[step] = record  # a rerun of a step after resume replaces the lost one
        elif kind == "eval":
            if isinstance(record.get("step"), int) and _num(record.get("val_loss")) is not None:
                log.evals[record["step"]] = float(record["val_loss"])
        elif kind == "summary":
            log.summary = record
    return log


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run dirs named directly or found below roots (recursively); errors for bad paths."""
    found: dict[Path, None] = {}
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UsageError(f"path {str(path)!r} does not exist; give run directories "
                             f"(holding {METRICS}) or folders above them, e.g. runs/")
        if path.is_file():
            if path.name != METRICS:
                raise UsageError(f"{str(path)!r} is a file, not {METRICS} or a directory")
            found[path.parent.resolve()] = None
            continue
        before = len(found)
        for root, dirs, files in os.walk(path):
            if METRICS in files:
                found[Path(root).resolve()] = None
                dirs.clear()  # a run dir holds no other runs
                continue
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        if len(found) == before:
            raise UsageError(f"no {METRICS} found in {str(path)!r} or below; did the runs start? "
                             f"(each run dir gets one from rank 0 of python -m train)")
    return list(found)


def read_submission(run_dir: Path) -> dict:
    """submission.json written by `hpcdp submit` ({} when absent or unreadable)."""
    try:
        data = json.loads((run_dir / "submission.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_ERROR_RE = re.compile(r"\berror\b|\bTraceback \(most recent call last\)|\bKilled\b"
                       r"|\bOut Of Memory\b|\boom-kill\b|DUE TO TIME LIMIT", re.IGNORECASE)
# The last line of a traceback, e.g. "RuntimeError: ..." or "1: torch.distributed.DistError: ..."
# (srun --label prefixes the rank).
_EXCEPTION_RE = re.compile(r"^\s*(?:\d+:\s*)?(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b")


@dataclass
class SlurmLogScan:
    files: list[str] = field(default_factory=list)
    tracebacks: int = 0
    error_lines: int = 0
    first_error: str | None = None
    last_exception: str | None = None


def scan_slurm_logs(run_dir: Path, job_ids: list[str] | None = None) -> SlurmLogScan:
    """Look through slurm-*.out for tracebacks and error lines (all of them, or these jobs')."""
    scan = SlurmLogScan()
    logs = sorted(run_dir.glob("slurm-*.out"))
    if job_ids:
        mine = [p for p in logs if any(p.name == f"slurm-{j}.out" for j in job_ids)]
        logs = mine or logs
    for log_path in logs:
        scan.files.append(log_path.name)
        try:
            text = log_path.read_text(errors="replace")
        except OSError:
            continue
        lines = text.splitlines()
        in_traceback = False
        for line in lines:
            if "Traceback (most recent call last)" in line:
                scan.tracebacks += 1
                in_traceback = True
                continue
            if in_traceback and _EXCEPTION_RE.match(line):
                # Ranks' prefixes ("0: ") are kept: they say which rank failed.
                scan.last_exception = line.strip()[:200]
                in_traceback = False
                continue
            if in_traceback:
                continue  # source lines quoted by the traceback are not error lines
            if _ERROR_RE.search(line):
                scan.error_lines += 1
                if scan.first_error is None:
                    scan.first_error = line.strip()[:200]
    return scan
