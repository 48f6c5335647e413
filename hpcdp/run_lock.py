"""One trainer per run folder, whichever way it was started.

Every way of starting a trainer (hpcdp submit, compare, run, a rendered script sbatch'ed by
hand, `python -m train`) ends in train/ claiming RUN_DIR/.trainer.lock: rank 0 holds an
exclusive flock on it for as long as it trains, and writes beside it who it is
(RUN_DIR/.trainer.owner: job id, pid, host). A second trainer finds the lock held and is refused
in one line that names the first. The lock goes with the process, so a trainer that was killed
(SIGKILL, a node lost) never leaves a stale claim behind. The commands check the same lock
before they queue or start anything (`check_free`), so a refusal usually comes at once rather
than from inside a job.

Why a lock of its own beside the job script's RUN_DIR/.job.lock: that one is held by a batch
shell and keeps two Slurm jobs apart; `hpcdp run` and `python -m train` have no batch shell.
A file system without locks (some NFS or Lustre mounts) gets a warning, not a refusal.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from hpcdp.errors import UsageError

LOCK_NAME = ".trainer.lock"
OWNER_NAME = ".trainer.owner"
WAIT_ENV = "HPCDP_LOCK_WAIT_S"
"""Seconds a new trainer waits for the lock (default 30, as the job script's own lock): a job
resubmitted after a hang can start while Slurm is still killing the old job's processes."""


def default_wait_s(environ=os.environ) -> float:
    try:
        return max(0.0, float(environ.get(WAIT_ENV, "30")))
    except ValueError:
        return 30.0


class RunFolderBusy(UsageError):
    """Another live trainer holds the run folder."""


def owner_text(run_dir: Path) -> str:
    """Who holds the folder, as recorded when it claimed it: 'job 123 (pid 456 on node1)'."""
    try:
        owner = json.loads((Path(run_dir) / OWNER_NAME).read_text())
        where = f"pid {owner['pid']} on {owner['host']}"
        return f"job {owner['job']} ({where})" if owner.get("job") else where
    except (OSError, ValueError, KeyError, TypeError):
        return "another trainer (its owner file is unreadable)"


def _busy(run_dir: Path) -> RunFolderBusy:
    owner = owner_text(run_dir)
    stop = (f"scancel {owner.split()[1]}" if owner.startswith("job ")
            else "stop that process")
    return RunFolderBusy(f"{run_dir} is in use by a trainer: {owner}; wait for it to end, "
                         f"{stop}, or give another --out")


def _try_lock(handle: IO[str]) -> bool:
    """True when this process now holds the lock; False when another one does. Raises
    OSError where the file system has no locks."""
    import fcntl

    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _no_locks(exc: OSError) -> bool:
    return exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def claim(run_dir: Path, job_id: str | None, wait_s: float | None = None,
          warn=print) -> IO[str] | None:
    """Hold RUN_DIR's trainer lock: the returned handle keeps it until closed or the process
    ends. RunFolderBusy when another trainer holds it; None (after a warning) where the file
    system cannot lock."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = open(run_dir / LOCK_NAME, "a")  # noqa: SIM115 - held for the run, closed by caller
    deadline = time.monotonic() + (default_wait_s() if wait_s is None else wait_s)
    try:
        while not _try_lock(handle):
            if time.monotonic() >= deadline:
                handle.close()
                raise _busy(run_dir)
            time.sleep(0.2)
    except OSError as exc:
        handle.close()
        if not _no_locks(exc):
            raise
        warn(f"train: warning: cannot lock {run_dir / LOCK_NAME} ({exc.strerror}); going on "
             "without it: make sure no other trainer uses this folder")
        return None
    owner = {"job": job_id, "pid": os.getpid(), "host": socket.gethostname()}
    tmp = run_dir / f"{OWNER_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(owner) + "\n")
    os.replace(tmp, run_dir / OWNER_NAME)
    return handle


def refuse_if_training(run_dir: Path, what: str) -> None:
    """A run continued elsewhere (--resume-from, train.resume_from) must have ended: a live one
    keeps writing checkpoints and deleting old ones, so the new run would take whichever was
    newest when it started, and fork the run. Every way in checks it: the CLI before queuing,
    the trainer when it starts (a script run by hand, `python -m train`)."""
    owner = holder(run_dir)
    if owner is not None:
        stop = f"hpcdp cancel {owner.split()[1]}" if owner.startswith("job ") else "stop it"
        raise RunFolderBusy(f"{what} {str(run_dir)!r} is still training ({owner}): a run "
                            "started from it now would fork it at whichever checkpoint is "
                            f"newest then; wait for it to end, or {stop}, then resume from it")


def holder(run_dir: Path) -> str | None:
    """Who trains in RUN_DIR now ('job 123 (pid 456 on node1)'), or None when no one does."""
    lock = Path(run_dir) / LOCK_NAME
    if not lock.is_file():
        return None
    try:
        with open(lock, "a") as handle:
            return None if _try_lock(handle) else owner_text(Path(run_dir))
    except OSError:
        return None  # cannot tell (no locks, no permission): the trainer's own claim decides


def check_free(run_dirs: list[Path], depth: int = 2) -> None:
    """Refuse (RunFolderBusy) when a live trainer holds any of these folders, or a folder up to
    `depth` levels below one (a campaign's cells)."""
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        candidates = [run_dir]
        for level in range(1, depth + 1):
            candidates += [p.parent for p in run_dir.glob("/".join(["*"] * level) + "/"
                                                          + LOCK_NAME)]
        for folder in candidates:
            if holder(folder) is not None:
                raise _busy(folder)
