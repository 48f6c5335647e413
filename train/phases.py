"""Where a training step's time goes, without a synchronize per phase.

`train_step` marks the end of each phase; on CPU a mark is a perf_counter reading, on CUDA an
event recorded on the current stream, read only after the loop's one synchronize per step
(elapsed times between events need no extra synchronisation). Phases, summed over the
micro-steps of a step:

    data       next batch and its copy to the device
    forward    forward and loss
    backward   backward; for DDP this includes the gradient all-reduce that backward could
               not hide (timed bucket by bucket in the step record's `ddp_comm_s`)
    sync       explicit gradient synchronisation after backward (Horovod's synchronize):
               communication no computation hides
    optimizer  unscaling, clipping, the optimizer step, zeroing the gradients
"""

from __future__ import annotations

import time

import torch

PHASES = ("data", "forward", "backward", "sync", "optimizer")


class PhaseTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str | None, object]] = []

    def mark(self, phase: str | None) -> None:
        """The end of `phase`; None: the step starts."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((phase, event))
        else:
            self._marks.append((phase, time.perf_counter()))

    def read(self) -> dict[str, float]:
        """Seconds per phase since the step started (call after the step synchronised)."""
        out = dict.fromkeys(PHASES, 0.0)
        for (_, start), (phase, end) in zip(self._marks, self._marks[1:]):
            seconds = start.elapsed_time(end) / 1e3 if self.cuda else end - start
            out[phase or "data"] += seconds
        self._marks.clear()
        return out


class NoTimer:
    """For callers that do not want the breakdown (benchmarks, tests)."""

    def mark(self, phase: str | None) -> None:
        pass


NO_TIMER = NoTimer()
