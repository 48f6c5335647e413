"""How far a run has got, read from its metrics.jsonl (for `hpcdp status`): step of total, the
last loss, tokens/s and the time left. Reads the file's first and last bytes only, so a run of a
million steps costs as little as a new one; no torch, no Slurm.

A campaign folder (hpcdp compare) has no metrics of its own: its progress is the cell it is on
(the first one of campaign.json not in cells.done), counted as cell k of N.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcdp import run_folder
from hpcdp.run_folder import METRICS_FILE


@dataclass(frozen=True)
class Progress:
    step: int
    total_steps: int
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    """Steps left x the median step time of the last records; None until two steps ran."""
    cell: str | None = None
    """In a campaign: "k/N name" of the cell running."""
    state: str | None = None
    """What is known where there are no steps to count: a campaign's cell that has not written
    its first record ("starting"), a network probe, or a campaign with every cell behind it."""

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """`120/300 loss 2.31 16,594 tok/s ETA 3m05s` (what is known)."""
        parts = [self.state] if self.state and not self.total_steps \
            else [f"{self.step}/{self.total_steps}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        if self.eta_s is not None:
            parts.append(f"ETA {format_duration(self.eta_s)}")
        if self.cell:
            parts.insert(0, f"cell {self.cell}:")
        return " ".join(parts)


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def of_metrics(path: Path) -> Progress | None:
    """Progress of one run's metrics.jsonl; None when it has no header yet."""
    head, records = run_folder.head_and_tail(path)  # the tail: the last dozens of steps
    # A resumed run appends a header per segment: the last one has the current settings, and
    # only the records after it are of this segment (elapsed_s restarts with each).
    starts = [i for i, r in enumerate(records) if r.get("kind") == "header"]
    if starts:
        header, records = records[starts[-1]], records[starts[-1] + 1:]
    else:
        header = head or {}
    if header.get("kind") != "header":
        return None
    total = int(header.get("config", {}).get("train", {}).get("steps") or 0)
    steps = [r for r in records if r.get("kind") == "step" and isinstance(r.get("step"), int)]
    summary = next((r for r in reversed(records) if r.get("kind") == "summary"), None)
    if not steps:
        return Progress(int(header.get("start_step") or 0), total, None, None, None)
    last = steps[-1]
    step = int(summary["steps"]) if summary and summary.get("steps") else last["step"]
    # Step records are every log_interval steps: time per step from consecutive records.
    recent = steps[-11:]
    per_step = [(b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"])
                for a, b in zip(recent, recent[1:])
                if b["step"] > a["step"] and isinstance(b.get("elapsed_s"), (int, float))
                and isinstance(a.get("elapsed_s"), (int, float))]
    # A summary means the run has ended (finished, stopped or cancelled): no time is left.
    eta = max(0, total - step) * statistics.median(per_step) if per_step and not summary else None
    return Progress(step, total, last.get("loss"), last.get("tokens_per_s"), eta)


def of_campaign(folder: Path) -> Progress | None:
    """The running (or last) cell of a campaign folder, as cell k of N, counted as the
    campaign's log counts them: the network probes first, then the cells, then the end probes."""
    try:
        record = json.loads((folder / "campaign.json").read_text())
        order = record.get("baseline", []) + record["cells"] + record.get("baseline_end", [])
        done = (folder / "cells.done").read_text() if (folder / "cells.done").exists() else ""
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not order:
        return None
    # cells.done: "cell KEY EXIT_CODE" per cell that ran to its end, "failed KEY EXIT_CODE" for
    # a first attempt that failed (retried at the end of its round): both are behind us.
    lines = [parts for parts in map(str.split, done.splitlines()) if len(parts) == 3]
    attempted = {parts[1] for parts in lines if parts[0] in ("cell", "failed")}
    current = next((i for i, c in enumerate(order) if c["key"] not in attempted), None)
    if current is None:  # every cell has run: what it came to, not the last probe's "0/0"
        failed = sum(parts[0] == "cell" and parts[2] != "0" for parts in lines)
        return Progress(0, 0, None, None, None, state=f"all {len(order)} cells done"
                        + (f", {failed} failed" if failed else ""))
    cell = order[current]
    inner = of_metrics(Path(cell["run_dir"]) / METRICS_FILE)
    probe = cell in record.get("baseline", []) + record.get("baseline_end", [])
    label = f"{current + 1}/{len(order)} {cell['key']}"
    return dataclasses.replace(
        inner or Progress(0, 0, None, None, None, state="network probe" if probe else "starting"),
        cell=label)


def _campaign_of_job(folder: Path, job_id: str | None) -> Path | None:
    """The folder holding the campaign of `job_id`: `folder` itself, or, when `--fresh` moved
    that campaign aside and a new one took its place, the moved folder (compare.old-TIME)."""
    def job_of(path: Path) -> str | None:
        try:
            return str(json.loads((path / "submission.json").read_text()).get("job_id"))
        except (OSError, ValueError, AttributeError):
            return None

    if job_id is None or job_of(folder) in (None, job_id):
        return folder
    for moved in sorted(folder.parent.glob(f"{folder.name}.old-*")):
        if job_of(moved) == job_id:
            return moved
    return None


def of_run_dir(run_dir: Path, job_id: str | None = None) -> Progress | None:
    """What `hpcdp status` shows for a job's run folder (a cell's or a campaign's)."""
    if (run_dir / "campaign.json").exists():
        folder = _campaign_of_job(run_dir, job_id)
        return of_campaign(folder) if folder else None
    return of_metrics(run_dir / METRICS_FILE)
