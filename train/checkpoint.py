"""Checkpoints: DIR/checkpoints/step-NNNNNNN.pt, written by rank 0 atomically (temp + rename).

A checkpoint holds everything needed to continue as if never stopped: model, optimizer, scaler,
step, the data stream's position, RNG states and the resolved experiment. A requeued Slurm job
runs with --resume and continues from the newest one.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NAME = re.compile(r"step-(\d{7,})\.pt")


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def path_for(out_dir: Path, step: int) -> Path:
    return checkpoint_dir(out_dir) / f"step-{step:07d}.pt"


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first (temp files never match)."""
    folder = checkpoint_dir(out_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.fullmatch(p.name))]
    return sorted(found)


def latest(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(out_dir: Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write atomically (a reader or a crash never sees half a file); keep the newest `keep`."""
    path = path_for(out_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for _, old in list_checkpoints(out_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path) -> dict[str, Any]:
    # weights_only=False: our own files, and they hold numpy/python RNG states.
    return torch.load(path, map_location="cpu", weights_only=False)
