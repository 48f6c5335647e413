"""Stop requests: SIGTERM, SIGUSR1 and SIGUSR2 (Slurm's warning before a time limit or a
preemption; the rendered scripts forward USR2 to the ranks) end training cleanly.

`catch_early` runs first thing in `python -m train`, before torch loads: a signal that arrives
while a rank is still starting would otherwise kill it (the default action of all three) with
no checkpoint. It only records the signal; the loop's StopSignal takes it over.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch

    from train.strategies import Strategy

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_early: str | None = None


def _record_early(signum: int, frame: Any) -> None:
    global _early
    _early = signal.Signals(signum).name


def catch_early() -> None:
    """Record stop signals from now on instead of dying of them."""
    for sig in SIGNALS:
        try:
            signal.signal(sig, _record_early)
        except ValueError:  # not the main thread
            pass


class Agreement(NamedTuple):
    stop: bool
    checkpoint: bool


MAX_CHECK_INTERVAL = 50
"""Steps between agreements at most, however fast the steps."""


class StopSignal:
    """The handler only sets a flag; the ranks agree (any rank signalled -> all stop at the
    same step), save a checkpoint and leave, so a requeued job resumes there. A signal caught
    during start-up (catch_early) counts as received.

    The agreement is one all-reduce of [signalled, steps to the next check, checkpoint due],
    at steps every rank knows: the first step, then as many steps later as the ranks' mean
    proposal (about `check_every_s` of steps: train.stop_check_s). The all-reduce gives every
    rank the same result, so every rank checks at the same steps; between checks, nothing is
    communicated or synchronised (a collective and a host sync every step cost DDP's one-rank
    path about 10% on the tiny model; Slurm's warning comes tens of seconds before the limit).

    The same all-reduce carries the time-based checkpoint: each rank's clock says when
    train.checkpoint_every_s has passed, and clocks differ, while a sharded save (DCP, ZeRO-1's
    consolidation) is a collective that every rank must enter at the same step: a rank deciding
    alone left the others in the next forward, a deadlock."""

    def __init__(self, check_every_s: float = 1.0) -> None:
        self.name: str | None = _early
        self.check_every_s = check_every_s
        self.next_check = 0
        self._previous: dict[int, Any] = {}
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. run() called from a thread)
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.name = signal.Signals(signum).name

    def check_now(self) -> None:
        """Agree at the next call (every rank must call it at the same step)."""
        self.next_check = 0

    def agreed(self, strategy: Strategy, device: torch.device, step: int,
               step_time_s: float, checkpoint_due: bool = False) -> Agreement:
        """What every rank does after this step: stop (with a checkpoint), and/or checkpoint
        because some rank's clock says it is time (`checkpoint_due`, this rank's view)."""
        import torch

        if strategy.world_size == 1:
            return Agreement(stop=self.name is not None, checkpoint=checkpoint_due)
        if step < self.next_check:
            return Agreement(stop=False, checkpoint=False)
        proposal = min(MAX_CHECK_INTERVAL,
                       max(1, int(self.check_every_s / max(step_time_s, 1e-6))))
        flags = torch.tensor([1.0 if self.name else 0.0, float(proposal),
                              1.0 if checkpoint_due else 0.0], device=device)
        signalled, interval, due = strategy.mean(flags).tolist()
        self.next_check = step + max(1, round(interval))
        if signalled > 0:
            self.name = self.name or "stop signal (on another rank)"
        return Agreement(stop=signalled > 0, checkpoint=due > 0)

    def restore(self) -> None:
        """The handlers from before; the start-up recorder becomes the default again, so that
        a signal after training (e.g. torchrun ending a failed job) ends the process."""
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is _record_early else previous)
