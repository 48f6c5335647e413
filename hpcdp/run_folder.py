"""The run folder's names: what hpcdp and train/ write in a run's folder, each named once here
(docs/architecture.md, "Run directory"). No torch, no I/O."""

from __future__ import annotations

import re

METRICS_FILE = "metrics.jsonl"
"""One JSON record per line: a header per segment, steps, evals, a summary (docs/metrics.md)."""
EXPERIMENT_FILE = "experiment.yaml"
"""The experiment as resolved at submission: what the job trains, and what --resume-from reads."""
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_NAME = re.compile(r"step-(\d{7,})\.(pt|dcp)")
"""A checkpoint: its step in seven digits or more, then .pt (one file) or .dcp (sharded)."""


def checkpoint_name(step: int, sharded: bool) -> str:
    return f"step-{step:07d}{'.dcp' if sharded else '.pt'}"
