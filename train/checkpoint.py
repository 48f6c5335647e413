"""Checkpoints: DIR/checkpoints/step-NNNNNNN.pt, written by rank 0 atomically (temp + rename);
for the sharded strategies (FSDP, HSDP) DIR/checkpoints/step-NNNNNNN.dcp/, a folder in which
every rank writes its shard with torch.distributed.checkpoint (DCP), renamed into place whole.

A checkpoint holds everything needed to continue as if never stopped: model, optimizer, scaler,
step, the data stream's position, RNG states and the resolved experiment. A requeued Slurm job
runs with --resume and continues from the newest intact one.

Beside each, step-NNNNNNN.pt.sha256 records its size and digest when it was written: a file cut
short or damaged later (a full disk, a node lost while copying, a truncate) is found before
torch reads it, and the resume falls back to the previous checkpoint (keep_checkpoints >= 2).
A disk that fills while writing ends the run with one line saying so; the temporary file goes.
A sharded checkpoint's digest covers every file of its folder; loading it at another world size
reshards (DCP reads each rank's slices of the saved global tensors).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hpcdp.errors import UsageError
from hpcdp.run_folder import CHECKPOINT_DIR, CHECKPOINT_NAME, checkpoint_name

# torch is imported in the functions that use it: `hpcdp export`, `sample` and `eval` find and
# check a run's checkpoints before they load torch, so their refusals take 0.3 s, not 5.

_TEMP = re.compile(r"\.step-\d{7,}\.(?:pt|dcp)\.tmp-(\d+)")
DIGEST_SUFFIX = ".sha256"
SHARDED_SUFFIX = ".dcp"
EXTRA_FILE = "extra.pt"
"""In a sharded checkpoint: what is not a shard (step, data stream, RNG, config), rank 0's."""


class CheckpointError(UsageError):
    """A checkpoint could not be written or none can be read: one line, the job fails."""

    exit_code = 1


def checkpoint_dir(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINT_DIR


def path_for(out_dir: Path, step: int, sharded: bool = False) -> Path:
    return checkpoint_dir(out_dir) / checkpoint_name(step, sharded)


def is_sharded(path: Path) -> bool:
    return Path(path).suffix == SHARDED_SUFFIX


def list_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first (temp files never match)."""
    folder = checkpoint_dir(out_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := CHECKPOINT_NAME.fullmatch(p.name))]
    return sorted(found)


def latest(out_dir: Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    import torch

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def _files(path: Path) -> list[Path]:
    """A checkpoint's files: itself, or every file of its folder in name order."""
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in _files(path))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    for file in _files(path):
        if path.is_dir():
            h.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _payload_bytes(obj: Any) -> int:
    """Bytes of the tensors in a checkpoint payload: about what torch.save writes."""
    import torch

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
            _remove(p)
            digest_path(p).unlink(missing_ok=True)


def save(out_dir: Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write atomically (a reader or a crash never sees half a file), record its size and
    digest, keep the newest `keep`. A full disk raises CheckpointError, the temp file removed."""
    import torch

    path = path_for(out_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with _cleaned_on_failure(tmp, path, _payload_bytes(payload)):
        torch.save(payload, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    return _commit(tmp, path, out_dir, keep)


def sharded_temp(out_dir: Path, step: int, token: int) -> Path:
    """The folder every rank writes a sharded checkpoint into: named after rank 0's pid
    (`token`, broadcast), so that every rank names the same one."""
    path = path_for(out_dir, step, sharded=True)
    return path.with_name(f".{path.name}.tmp-{token}")


def save_sharded(out_dir: Path, step: int, shards: dict[str, Any], extra: dict[str, Any],
                 token: int, is_main: bool, keep: int = 2) -> Path | None:
    """Every rank calls this (DCP's save is collective); rank 0 then writes `extra`, records the
    folder's digest, renames it into place and prunes. Returns the path on rank 0. A failed
    save (DCP tells every rank when any rank's write failed) removes the temporary folder on
    every rank, so the disk it filled is free again before any rank records its exit."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = path_for(out_dir, step, sharded=True)
    tmp = sharded_temp(out_dir, step, token)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_main:
        _remove_stale_temps(path.parent)
    with _cleaned_on_failure(tmp, path, _payload_bytes(shards)):  # DTensors: global sizes
        dcp.save(shards, checkpoint_id=str(tmp))
        if not is_main:
            return None
        torch.save(extra, tmp / EXTRA_FILE)
        for file in _files(tmp):
            with open(file, "rb") as f:
                os.fsync(f.fileno())
    return _commit(tmp, path, out_dir, keep)


def _is_dcp_failure(exc: BaseException) -> bool:
    """DCP's CheckpointException derives from BaseException, not Exception."""
    return type(exc).__name__ == "CheckpointException" and hasattr(exc, "failures")


def _free(path: Path) -> None:
    """Remove a failed write's temporary file or folder, emptying each file first: a removed
    file that a process still holds open keeps its blocks (the failed torch.save's file lives
    on in the exception's traceback), and a full disk must be free again at once. A sharded
    save's folder is every rank's: another rank may remove it while this one walks it."""
    try:
        files = _files(path) if path.exists() else []
    except FileNotFoundError:
        files = []
    for file in files:
        with contextlib.suppress(OSError):
            os.truncate(file, 0)
    _remove(path)


@contextlib.contextmanager
def _cleaned_on_failure(tmp: Path, path: Path, needed: int) -> Iterator[None]:
    """A failed write removes its temporary file or folder; a full disk becomes one line."""
    try:
        yield
    except BaseException as exc:
        _free(tmp)
        digest_path(tmp).unlink(missing_ok=True)
        if not isinstance(exc, Exception) and not _is_dcp_failure(exc):
            raise  # KeyboardInterrupt, SystemExit: the temporary is gone, the rest as it was
        free = shutil.disk_usage(path.parent).free
        # torch reports a full disk as a RuntimeError ("file write failed", "unexpected pos"),
        # DCP as a CheckpointException around the failing rank's OSError.
        if (getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc)
                or free < needed):
            raise CheckpointError(
                f"no space left on device writing checkpoint {path} ({needed / 1e6:.0f} MB "
                f"needed, {free / 1e6:.0f} MB free); older checkpoints are intact: free space "
                "and run again to resume") from None
        raise


def _commit(tmp: Path, path: Path, out_dir: Path, keep: int) -> Path:
    """Record the written checkpoint's size and digest, rename both into place, prune."""
    record = {"bytes": _size(tmp), "sha256": _sha256(tmp)}
    sidecar = digest_path(tmp)
    with _cleaned_on_failure(tmp, path, 1):
        sidecar.write_text(json.dumps(record) + "\n")
    os.replace(sidecar, digest_path(path))
    if path.is_dir():  # a folder left by a run killed between renames: this one replaces it
        shutil.rmtree(path)
    os.replace(tmp, path)
    for _, old in list_checkpoints(out_dir)[:-keep]:
        _remove(old)
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
    size = _size(path)
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
    """A file checkpoint's whole state, or a sharded one's `extra` (its shards are read by
    load_shards, into the running model's layout)."""
    import torch

    path = Path(path)
    # weights_only=False: our own files, and they hold numpy/python RNG states.
    return torch.load(path / EXTRA_FILE if path.is_dir() else path, map_location="cpu",
                      weights_only=False)


def load_shards(path: Path, shards: dict[str, Any]) -> None:
    """Fill `shards` (this rank's state dicts, as get_state_dict gives them) from a sharded
    checkpoint, resharding where it was written by another number of ranks. Collective."""
    import torch.distributed.checkpoint as dcp

    dcp.load(shards, checkpoint_id=str(path))
