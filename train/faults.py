"""Fault injection for hpcdp's own tests: HPCDP_FAULT makes ranks misbehave after a step.

Only the test suite sets it; a user never needs it. It exists so that the failure paths
(checkpoint on a signal, resume, hang bounds) can be exercised at a known step instead of by
racing a signal against a run that may already have finished. Forms:

    pause@STEP          after STEP, every rank waits (up to PAUSE_LIMIT_S) for a stop signal
    kill@STEP[:RANK]    after STEP, before its checkpoint, the rank SIGKILLs itself (a hard kill)
    hang@STEP[:RANK]    after STEP, the rank SIGSTOPs itself (a hung rank); RANK defaults to 0
    raise@STEP[:RANK]   after STEP, the rank raises an exception (a crashing rank)
    slow@STEP[:RANK]    after STEP, the rank sleeps SLOW_S (a straggler: at the same step, its
                        clock reads SLOW_S later than the others')
    hog@STEP[:RANK]     after STEP, the rank takes memory (HOG_CHUNK_MB at a time, every page
                        touched) until something kills it (a leak, or activations outgrowing
                        the node), or raises MemoryError past HOG_LIMIT_MB
    segv@start[:RANK]   before its strategy connects, the rank dies of SIGSEGV (a crash in
                        MPI's or NCCL's start-up, which the job script relaunches)

kill, hang, raise, slow, hog and segv fire once per run folder (a marker file records it), so
that the job that resumes the run (requeued, or resubmitted by `train.on_hang: requeue`) carries
on.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcdp.errors import UsageError

ENV_VAR = "HPCDP_FAULT"
PAUSE_LIMIT_S = 120
SLOW_S = 5.0
HOG_CHUNK_MB, HOG_LIMIT_MB = 64, 8192
_FORM = re.compile(r"(?P<kind>pause|kill|hang|raise|slow|hog)@(?P<step>[1-9][0-9]*)"
                   r"(?::(?P<rank>[0-9]+))?|(?P<start_kind>segv)@start(?::(?P<start_rank>[0-9]+))?")
START = 0
"""The step of a fault that fires at start-up, before step 1."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int = 0

    def at_start(self, rank: int, fired_marker: Path | None = None) -> None:
        """Called by every rank before its strategy connects; a segv@start fault fires here."""
        if self.step == START and rank == self.rank and self._first_time(fired_marker):
            os.kill(os.getpid(), signal.SIGSEGV)

    def _first_time(self, fired_marker: Path | None) -> bool:
        """Whether the fault has not fired in this run folder yet; records that it fires now."""
        if fired_marker is None:
            return True
        if fired_marker.exists():
            return False
        fired_marker.write_text(f"{self.kind}@{self.step or 'start'}:{self.rank}\n")
        return True

    def after_step(self, step: int, rank: int, stop_requested: Callable[[], bool],
                   keep_alive: Callable[[], None] = lambda: None,
                   fired_marker: Path | None = None) -> bool:
        """keep_alive: called while pausing, so that the progress watchdog knows the pause is
        deliberate. fired_marker: the file that says a kill or hang already fired here.
        True when every rank paused at this step."""
        if step != self.step or (self.kind != "pause" and rank != self.rank):
            return False
        if self.kind != "pause" and not self._first_time(fired_marker):
            return False
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "raise":
            raise RuntimeError(f"{ENV_VAR}={self.kind}@{self.step}:{self.rank}: a crashing rank")
        if self.kind == "slow":
            _sleep(SLOW_S, keep_alive)
        if self.kind == "hog":
            _hog()
        if self.kind == "pause":
            _sleep(PAUSE_LIMIT_S, keep_alive, until=stop_requested)
            return True
        return False


def _hog() -> None:
    held = []
    while len(held) * HOG_CHUNK_MB < HOG_LIMIT_MB:
        held.append(bytearray(HOG_CHUNK_MB << 20))  # zero-filled: resident, not just reserved
        time.sleep(0.05)
    raise MemoryError(f"{ENV_VAR}=hog: {HOG_LIMIT_MB} MB taken and nothing stopped it")


def _sleep(seconds: float, keep_alive: Callable[[], None],
           until: Callable[[], bool] = lambda: False) -> None:
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        keep_alive()
        time.sleep(0.05)


def from_environment(environ: dict[str, str] | None = None) -> Fault | None:
    raw = (os.environ if environ is None else environ).get(ENV_VAR, "").strip()
    if not raw:
        return None
    match = _FORM.fullmatch(raw)
    if not match:
        raise UsageError(f"{ENV_VAR}={raw!r} is not a fault; valid: pause@STEP, "
                         "kill@STEP[:RANK], hang@STEP[:RANK], raise@STEP[:RANK], "
                         "slow@STEP[:RANK], hog@STEP[:RANK], segv@start[:RANK]")
    if match["start_kind"]:
        return Fault(kind=match["start_kind"], step=START, rank=int(match["start_rank"] or 0))
    return Fault(kind=match["kind"], step=int(match["step"]), rank=int(match["rank"] or 0))
