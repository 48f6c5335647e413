"""`hpcdp harvest --to TRACKER DIR`: the runs' metrics.jsonl replayed into a tracker, as if it
had run with the job. It lives in harvest, beside the run discovery it uses, and imports the
trackers from hpcdp/tracking.py: tracking (which training and config import) imports nothing of
harvest, so the two have no import cycle."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from hpcdp.errors import UsageError
from hpcdp.harvest.read import find_run_dirs
from hpcdp.run_folder import METRICS_FILE
from hpcdp.tracking import BACKENDS, INSTALL, RunIdentity, TrackedRun, replay

EXPORTABLE = ("tensorboard", "mlflow")


def check_export(tracker: str, dest: Path) -> None:
    """`harvest --to TRACKER DIR`: refused in one line before anything is read or written."""
    if tracker not in EXPORTABLE:
        raise UsageError(f"harvest --to {tracker!r}: valid: {', '.join(EXPORTABLE)} (W&B: train "
                         "with train.trackers=[wandb] and `wandb sync` its offline runs)")
    if importlib.util.find_spec(tracker) is None:
        raise UsageError(f"harvest --to {tracker}: {tracker} is not installed; {INSTALL[tracker]}")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"harvest --to {tracker} {str(dest)!r} is a file; give a folder")
    if tracker == "mlflow" and dest.is_dir():
        # An MLflow file store takes every folder in it for an experiment.
        strangers = sorted(p.name for p in dest.iterdir() if p.name not in (".trash", "models")
                           and not (p / "meta.yaml").is_file())
        if strangers:
            raise UsageError(f"harvest --to mlflow {str(dest)!r} holds more than an MLflow store "
                             f"({', '.join(strangers[:3])}); give MLflow a folder of its own")


def export(paths: list[Path], tracker: str, dest: Path,
           log: Callable[[str], None]) -> tuple[int, int]:
    """Replay the metrics.jsonl of the runs at or below `paths` into a tracker under DEST;
    runs it already holds are skipped. Returns (runs exported, runs found)."""
    check_export(tracker, dest)  # before the search: its errors name the tracker, not the runs
    run_dirs = find_run_dirs(paths)
    exported = 0
    for run_dir in run_dirs:
        ident = RunIdentity.of(run_dir, export_to=dest)
        if BACKENDS[tracker].holds(ident):
            log(f"{run_dir}: already in {tracker} under {dest}; skipped")
            continue
        header, records, summary = replay(run_dir / METRICS_FILE)
        tracked = TrackedRun([tracker], run_dir, lambda line: None, already_sent=0, ident=ident)
        tracked.feed({**header, "kind": "header", "start_step": 0})
        for record in records:
            tracked.feed(record)
        report = tracked.close(summary, str((summary or {}).get("status", "interrupted")))
        if not report.get(tracker, "").startswith("wrote"):
            raise UsageError(f"harvest --to {tracker}: {run_dir}: {report[tracker]}")
        log(f"{run_dir}: {report[tracker]}")
        exported += 1
    return exported, len(run_dirs)
