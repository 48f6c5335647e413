"""metrics.jsonl (one JSON object per line, rank 0 only) and the human stdout line.

The schema is docs/metrics.md (and docs/architecture.md); hpcdp harvest reads this file and
never scrapes stdout. Non-finite floats (a skipped fp16 step's grad norm) are written as null,
so every line is strict JSON.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, TextIO

from hpcdp.errors import one_line, positive_number

# Dense peak FLOP/s per device for the precisions the strategies train in (vendor datasheets,
# SXM parts, no sparsity). fp32 means plain fp32 (not TF32). Matched against the device name.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12},
    "H100": {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12},
    "A100": {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12, "bf16": None},  # no bf16 on V100
}


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of one device, or None when unknown (CPUs, unlisted GPUs).

    HPCDP_PEAK_FLOPS (a number, FLOP/s per device) overrides the table, e.g. for a CPU node.
    """
    override = os.environ.get("HPCDP_PEAK_FLOPS")
    if override:
        return _peak_flops_override(override)
    for key, table in PEAK_FLOPS.items():
        if key in device_name.upper():
            return table.get(precision)
    return None


def _peak_flops_override(text: str) -> float:
    """HPCDP_PEAK_FLOPS as a positive finite number, else one line saying what is wanted."""
    return positive_number(text, f"HPCDP_PEAK_FLOPS={one_line(text)!r} is not valid: give the "
                           "peak FLOP/s of one device as a positive number, e.g. 3.12e14")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Appends records to DIR/metrics.jsonl and flushes each line; a no-op on ranks other than 0."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
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

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def step_line(step: int, steps: int, loss: float, lr: float, tokens_per_s: float,
              step_time_s: float, strategy: str, world_size: int) -> str:
    """The stdout line of a logged step (docs/architecture.md)."""
    return (f"step {step}/{steps} | loss {loss:.4f} | lr {lr:.1e} | {tokens_per_s:.0f} tok/s | "
            f"{step_time_s * 1e3:.1f} ms | strategy {strategy} | world {world_size}")
