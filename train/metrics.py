"""metrics.jsonl (one JSON object per line, rank 0 only) and the human stdout line.

The schema is docs/metrics.md (and docs/architecture.md); hpcdp harvest reads this file and
never scrapes stdout. Non-finite floats (a skipped fp16 step's grad norm) are written as null,
so every line is strict JSON.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, TextIO

from hpcdp.peaks import PEAK_FLOPS, peak_flops  # noqa: F401 - the MFU's table, shared with hpcdp


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to DIR/metrics.jsonl and flushes each line; a no-op on ranks other than 0.
    `tracked` (hpcdp.tracking.TrackedRun) gets a copy of every record for the run's trackers."""

    def __init__(self, path: Path | None, tracked: Any = None) -> None:
        self.path = path
        self.tracked = tracked if path is not None else None
        self._file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def write(self, kind: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"kind": kind, "time": time.time(), **{k: _finite(v) for k, v in fields.items()}}
        self._file.write(json.dumps(record, allow_nan=False, default=str) + "\n")
        self._file.flush()
        if self.tracked is not None:
            self.tracked.feed(record)

    def close_trackers(self, summary: dict | None, status: str) -> dict[str, str]:
        """Finish the trackers; what each wrote (the summary record's `trackers`)."""
        return self.tracked.close(summary, status) if self.tracked is not None else {}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def step_line(step: int, steps: int, loss: float, lr: float, tokens_per_s: float,
              step_time_s: float, strategy: str, world_size: int) -> str:
    """The stdout line of a logged step (docs/architecture.md)."""
    return (f"step {step}/{steps} | loss {loss:.4f} | lr {lr:.1e} | {tokens_per_s:.0f} tok/s | "
            f"{step_time_s * 1e3:.1f} ms | strategy {strategy} | world {world_size}")
