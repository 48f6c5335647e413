"""Checkpoints: DIR/checkpoints/step-NNNNNNN.pt, written by rank 0 atomically (temp + rename).

A checkpoint holds everything needed to continue as if never stopped: model, optimizer, scaler,
step, the data stream's position, RNG states and the resolved experiment. A requeued Slurm job
runs with --resume and continues from the newest intact one.

Beside each, step-NNNNNNN.pt.sha256 records its size and digest when it was written: a file cut
short or damaged later (a full disk, a node lost while copying, a truncate) is found before
torch reads it, and the resume falls back to the previous checkpoint (keep_checkpoints >= 2).
A disk that fills while writing ends the run with one line saying so; the temporary file goes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp.errors import UsageError

_NAME = re.compile(r"step-(\d{7,})\.pt")
_TEMP = re.compile(r"\.step-\d{7,}\.pt\.tmp-(\d+)")
DIGEST_SUFFIX = ".sha256"


class CheckpointError(UsageError):
    """A checkpoint could not be written or none can be read: one line, the job fails."""

    exit_code = 1


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


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _payload_bytes(obj: Any) -> int:
    """Bytes of the tensors in a checkpoint payload: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_payload_bytes(v) for v in obj)
    return 0


def _remove_stale_temps(folder: Path) -> None:
    """Temporary files of writers that died (killed mid-save): never a checkpoint."""
    for p in folder.iterdir():
        m = _TEMP.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid():
            p.unlink(missing_ok=True)


def save(out_dir: Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write atomically (a reader or a crash never sees half a file), record its size and
    digest, keep the newest `keep`. A full disk raises CheckpointError, the temp file removed."""
    path = path_for(out_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(payload, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        record = {"bytes": tmp.stat().st_size, "sha256": _sha256(tmp)}
        sidecar = digest_path(tmp)
        sidecar.write_text(json.dumps(record) + "\n")
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)
        digest_path(tmp).unlink(missing_ok=True)
        needed = _payload_bytes(payload)
        free = shutil.disk_usage(path.parent).free
        # torch reports a full disk as a RuntimeError ("file write failed", "unexpected pos")
        if getattr(exc, "errno", None) == errno.ENOSPC or free < needed:
            raise CheckpointError(
                f"no space left on device writing checkpoint {path} ({needed / 1e6:.0f} MB "
                f"needed, {free / 1e6:.0f} MB free); older checkpoints are intact: free space "
                "and run again to resume") from None
        raise
    os.replace(sidecar, digest_path(path))
    os.replace(tmp, path)
    for _, old in list_checkpoints(out_dir)[:-keep]:
        old.unlink(missing_ok=True)
        digest_path(old).unlink(missing_ok=True)
    return path


def damage(path: Path) -> str | None:
    """Why a checkpoint cannot be trusted (size or digest differ from those recorded when it
    was written), or None when it is intact. One from before digests were recorded is trusted
    if torch can read it (load_intact tries)."""
    try:
        record = json.loads(digest_path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "its digest record is unreadable"
    size = path.stat().st_size
    if size != record.get("bytes"):
        return f"{size:,} bytes, {record.get('bytes'):,} when written"
    if _sha256(path) != record.get("sha256"):
        return "its sha256 differs from the one recorded when it was written"
    return None


def newest_intact(out_dir: Path, log=print) -> Path | None:
    """The newest checkpoint that is intact, saying in one line which newer ones were skipped
    and why; None when there is no checkpoint at all. CheckpointError when none is intact."""
    found = list_checkpoints(out_dir)
    skipped = []
    for _, path in reversed(found):
        why = damage(path)
        if why is None and not digest_path(path).exists():
            try:  # no digest (written before they were recorded): can torch read it?
                load(path)
            except Exception as exc:  # noqa: BLE001 - any failure to read means damaged
                why = f"unreadable ({type(exc).__name__})"
        if why is None:
            if skipped:
                log(f"train: skipped damaged checkpoint(s) {'; '.join(skipped)}; resuming from "
                    f"{path.name}")
            return path
        skipped.append(f"{path.name} ({why})")
    if found:
        raise CheckpointError(f"no intact checkpoint in {checkpoint_dir(out_dir)}: "
                              f"{'; '.join(skipped)}; remove them to start fresh")
    return None


def load(path: Path) -> dict[str, Any]:
    # weights_only=False: our own files, and they hold numpy/python RNG states.
    return torch.load(path, map_location="cpu", weights_only=False)
