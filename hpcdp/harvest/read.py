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

from hpcdp import job_end, run_folder, slurm
from hpcdp.errors import UsageError
from hpcdp.run_folder import CHECKPOINT_DIR, METRICS_FILE

METRICS = METRICS_FILE
# Directories that never hold a run's metrics: do not walk into them (the last three hold
# trackers' files: hpcdp/tracking.py).
_SKIP_DIRS = {CHECKPOINT_DIR, ".git", "__pycache__", ".venv", "node_modules", "tensorboard",
              "mlruns", "wandb"}


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
    summary: dict | None = None
    """The segment's own summary record (None: it was killed before writing one)."""


# Step fields harvest uses, in the writer's order. All but "time" are kept as columns; of the
# times only the newest counts (MetricsLog.last_time), and float() is what reading costs.
STEP_FIELDS = ("time", "step", "loss", "exposed_comm_s", "allreduce_s", "allreduce_bytes",
               "allreduce_calls", "step_time_s", "tokens_per_s", "elapsed_s", "max_mem_gb",
               "mfu")
COLUMNS = STEP_FIELDS[1:]
_ELAPSED = COLUMNS.index("elapsed_s")


@dataclass
class StepColumns:
    """Every step record read, in file order, one list per field (floats or None; step int).

    Columns rather than a dict per record: 10,000-step runs by the hundred are read in bulk
    (bench/harvest_bench.py)."""

    step: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    exposed_comm_s: list = field(default_factory=list)
    """Gradient communication no computation hid (train/phases.py); None in older files."""
    allreduce_s: list = field(default_factory=list)
    """The step's whole gradient all-reduce time, where the wrapper measures it (DDP)."""
    allreduce_bytes: list = field(default_factory=list)
    """Bytes rank 0 put into that all-reduce (None where it is not timed, and in older files)."""
    allreduce_calls: list = field(default_factory=list)
    """All-reduce calls (DDP's buckets) of that step."""
    step_time_s: list = field(default_factory=list)
    tokens_per_s: list = field(default_factory=list)
    elapsed_s: list = field(default_factory=list)
    max_mem_gb: list = field(default_factory=list)
    mfu: list = field(default_factory=list)
    seg: list = field(default_factory=list)
    """Index of the segment that wrote the row."""
    t: list = field(default_factory=list)
    """Training time: the segment's offset_s + elapsed_s."""


@dataclass
class MetricsLog:
    """Everything read from one metrics.jsonl."""

    path: Path
    segments: list[Segment] = field(default_factory=list)
    columns: StepColumns = field(default_factory=StepColumns)
    order: list[int] = field(default_factory=list)
    """Row indices into `columns` of the last record written for each step, by step number:
    a step redone after a resume replaces the lost one."""
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

    @property
    def steps(self) -> dict[int, dict]:
        """step -> its last record (the fields harvest uses, plus `_seg` and `_t`)."""
        c = self.columns
        cols = [getattr(c, name) for name in COLUMNS + ("seg", "t")]
        keys = COLUMNS + ("_seg", "_t")
        return {c.step[i]: {k: col[i] for k, col in zip(keys, cols)} for i in self.order}


# Speed (bench/harvest_bench.py): a step line exactly as train/metrics.py writes it (json.dumps,
# keys in schema order) is matched by this pattern, which captures only the fields harvest
# uses; the captured text is converted a column at a time. Any line it does not match (another
# writer's key order, a header, a damaged record) goes through run_folder.record_of, so the
# pattern can make reading faster, never different.
_NUMBER = r"(-?[0-9][0-9.eE+-]*|null)"
_STEP_LINE = re.compile(
    r'\{"kind": "step", "time": ' + _NUMBER + r', "step": ([0-9]+), "loss": ' + _NUMBER
    + r', .*?(?:"exposed_comm_s": ' + _NUMBER + r', )?(?:"allreduce_s": ' + _NUMBER
    + r', )?(?:"allreduce_bytes": ' + _NUMBER + r', "allreduce_calls": ' + _NUMBER
    + r', )?"step_time_s": ' + _NUMBER
    + r', "tokens_per_s": ' + _NUMBER
    + r', "tokens_seen": [^,]*, "elapsed_s": ' + _NUMBER + r', "max_mem_gb": ' + _NUMBER
    + r', "mfu": ' + _NUMBER + r'\}')
_STEP_PREFIX = '{"kind": "step"'
# The pattern's optional fields (group: key): one the line holds that the pattern skipped (a
# field written between them moves them out of place) sends the line to the slow path.
_OPTIONAL_GROUPS = {4: '"exposed_comm_s": ', 5: '"allreduce_s": ', 6: '"allreduce_bytes": '}
_NUMS = (int, float)


def _num(value) -> float | None:
    """A JSON number as float; None for null, strings, booleans (bool is not in _NUMS)."""
    return float(value) if value.__class__ in _NUMS else None


def _floats(column: tuple[str, ...]) -> list[float | None]:
    """Captured number texts -> floats; "null" (how the writer spells NaN/inf) -> None."""
    if "null" not in column and None not in column:
        return list(map(float, column))
    return [None if v in ("null", None) else float(v) for v in column]


class _Reader:
    """Builds a MetricsLog record by record; matched step lines wait in `pending` (text) and are
    converted a column at a time when something else comes or the file ends."""

    def __init__(self, log: MetricsLog) -> None:
        self.log = log
        self.pending: list[re.Match] = []
        self.times: list[float] = []

    def segment(self) -> Segment:
        if not self.log.segments:  # records before any header: a segment without one
            self.log.segments.append(Segment(header={}))
        return self.log.segments[-1]

    def flush(self) -> None:
        if not self.pending:
            return
        matches, self.pending = self.pending, []
        c = self.log.columns
        segment = self.segment()
        times, *cols = zip(*(m.groups() for m in matches))
        try:
            converted = [list(map(int, col)) if i == 0 else _floats(col)
                         for i, col in enumerate(cols)]
            newest = _floats(times[-1:])[0]  # rows of one segment come in time order
        except ValueError:  # a number the pattern let through but float() refuses ("1-2"):
            for match in matches:  # read those lines as any other line
                self.add_line(match.string)
            return
        for name, values in zip(COLUMNS, converted):
            getattr(c, name).extend(values)
        c.seg.extend([len(self.log.segments) - 1] * len(matches))
        if newest is not None:
            self.times.append(newest)
        self._segment_bounds(segment, converted[0][0], converted[0][-1],
                             converted[_ELAPSED][-1])

    @staticmethod
    def _segment_bounds(segment: Segment, first: int, last: int, elapsed: float | None) -> None:
        if segment.first_step is None:
            segment.first_step = first
        segment.last_step = last
        if elapsed is not None:
            segment.last_elapsed_s = elapsed

    def add_step_line(self, line: str) -> bool:
        match = _STEP_LINE.fullmatch(line)
        if match is None or any(match.group(g) is None and key in line
                                for g, key in _OPTIONAL_GROUPS.items()):
            return False
        self.pending.append(match)
        return True

    def add_line(self, line: str, may_be_cut: bool = False) -> None:
        """Any line, through run_folder.record_of: a record, or a corrupt line (one cut by a kill
        when it is the file's unterminated last line), with a record glued behind it recovered."""
        log = self.log
        record = run_folder.record_of(line)
        if record is not None:
            self.add_record(record)
            return
        if may_be_cut:
            log.truncated = True  # the writer died mid-line: expected after a kill, said so
        else:
            log.corrupt_lines += 1
        fused = run_folder.recovered_from(line)
        if fused is not None:
            self.add_record(fused)
            log.recovered_records += 1

    def add_record(self, record: dict) -> None:
        self.flush()
        log = self.log
        kind = record.get("kind")
        t = _num(record.get("time"))
        if kind == "header":
            log.segments.append(Segment(header=record))
        elif kind == "step":
            step = record.get("step")
            if step.__class__ is not int:
                log.corrupt_lines += 1
                return
            segment = self.segment()
            c = log.columns
            values = [_num(record.get(name)) for name in COLUMNS]
            values[0] = step
            for name, value in zip(COLUMNS, values):
                getattr(c, name).append(value)
            c.seg.append(len(log.segments) - 1)
            self._segment_bounds(segment, step, step, values[_ELAPSED])
        else:
            self.segment()
            if kind == "eval":
                if record.get("step").__class__ is int and _num(record.get("val_loss")) is not None:
                    log.evals[record["step"]] = float(record["val_loss"])
            elif kind == "summary":
                log.summary = self.segment().summary = record
        if t is not None:
            self.times.append(t)

    def finish(self) -> MetricsLog:
        self.flush()
        log, c = self.log, self.log.columns
        offset = 0.0
        for segment in log.segments:  # the time axis runs on across segments
            segment.offset_s = offset
            offset += segment.last_elapsed_s
        offsets = [s.offset_s for s in log.segments] or [0.0]
        c.t = [offsets[s] + (e or 0.0) for s, e in zip(c.seg, c.elapsed_s)]
        last_row = dict(zip(c.step, range(len(c.step))))  # later rows overwrite earlier ones
        log.order = [last_row[s] for s in sorted(last_row)]
        log.last_time = max(self.times) if self.times else None
        return log


def read_metrics(path: Path) -> MetricsLog:
    """Read metrics.jsonl; never raises on content (only on an unreadable file)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    log = MetricsLog(path=path)
    reader = _Reader(log)
    truncated_tail = bool(text) and not text.endswith("\n")
    lines = text.splitlines()
    log.lines = len(lines)
    last_index = len(lines) - 1
    add_step_line, add_line = reader.add_step_line, reader.add_line
    for i, line in enumerate(lines):
        if line.startswith(_STEP_PREFIX) and add_step_line(line):
            continue
        if line.strip():
            add_line(line, may_be_cut=truncated_tail and i == last_index)
    return reader.finish()


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


BASELINE_FILE = "allreduce.json"  # train/allreduce.py's RESULT_FILE


PROBE_FOLDERS = {"baseline": "start", "baseline-end": "end"}
"""A campaign's probe folders (<campaign>/baseline[-end]/<strategy>-<N>n/) and when they ran."""


def find_baselines(paths: list[Path]) -> list[dict]:
    """The network-baseline probes (hpcdp compare) under `paths`: each allreduce.json that
    reads as a mapping with a median time; anything else is skipped. Each is tagged with
    `path`, `when` ("start" under baseline/, "end" under baseline-end/, None elsewhere) and
    `campaign` (the folder holding baseline/: a campaign's probes explain only its own cells)."""
    found, seen = [], set()
    for path in paths:
        if not Path(path).is_dir():
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            file = Path(root).resolve() / BASELINE_FILE
            if BASELINE_FILE not in files or file in seen:
                continue
            seen.add(file)  # two paths that overlap
            try:
                record = json.loads(file.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and isinstance(record.get("median_s"), (int, float)):
                when = PROBE_FOLDERS.get(file.parent.parent.name)
                campaign = file.parent.parent.parent if when else file.parent.parent
                found.append({**record, "path": str(file), "when": when,
                              "campaign": str(campaign)})
    return found


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
    last_exception_file: str | None = None
    """The slurm-*.out that last_exception was read from."""
    last_traceback_file: str | None = None
    """The slurm-*.out holding the last traceback seen."""
    out_of_memory: str | None = None
    """hpcdp/job_end.py's line for the last log whose job ran out of memory."""
    node_failure: str | None = None
    """hpcdp/job_end.py's line for the last log whose job a node's failure ended (NODE_FAIL)."""


def scan_slurm_logs(run_dir: Path, job_ids: list[str] | None = None) -> SlurmLogScan:
    """Look through slurm-*.out for tracebacks and error lines (all of them, or these jobs')."""
    scan = SlurmLogScan()
    logs = sorted(run_dir.glob("slurm-*.out"))
    if job_ids:
        mine = [p for p in logs if any(p.name == slurm.job_log_name(j) for j in job_ids)]
        logs = mine or logs
    for log_path in logs:
        scan.files.append(log_path.name)
        try:
            text = log_path.read_text(errors="replace")
        except OSError:
            continue
        oom = job_end.out_of_memory(text)
        if oom:
            scan.out_of_memory = f"{log_path.name}: {oom.line()}"
        failed_node = job_end.node_failure(text)
        if failed_node:
            scan.node_failure = f"{log_path.name}: {failed_node}"
        lines = text.splitlines()
        planned = job_end.planned_stop_reports(text)  # a requeue's exit 143: not an error
        in_traceback = False
        for line in lines:
            if "Traceback (most recent call last)" in line:
                scan.tracebacks += 1
                scan.last_traceback_file = log_path.name
                in_traceback = True
                continue
            if in_traceback and _EXCEPTION_RE.match(line):
                # Ranks' prefixes ("0: ") are kept: they say which rank failed.
                scan.last_exception = line.strip()[:200]
                scan.last_exception_file = log_path.name
                in_traceback = False
                continue
            if in_traceback:
                continue  # source lines quoted by the traceback are not error lines
            if _ERROR_RE.search(line) and line.strip() not in planned:
                scan.error_lines += 1
                if scan.first_error is None:
                    scan.first_error = line.strip()[:200]
    return scan
