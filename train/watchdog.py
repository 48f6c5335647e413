"""The progress watchdog: a rank that sees no training step finish for too long writes every
thread's Python stack into RUN_DIR/hang/, says which ranks went silent, and ends itself, so
that srun (--kill-on-bad-exit) ends the job FAILED instead of letting it hang to its limit.

It bounds every hang, whatever blocks: a stopped or dead peer inside an MPI collective (which
no timeout of Horovod's MPI controller bounds), a deadlock, a stuck file system. The bound is
max(hang_factor x median step time, hang_floor_s), never more than dist_timeout_s (which also
bounds torch's collectives and Horovod's Gloo and stall shutdown), and dist_timeout_s until a
few steps have given a median.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

HANG_EXIT = 124
"""Exit code of a rank the watchdog ended (as timeout(1) uses it)."""
SUMMARY_WAIT_S = 3.0
"""How long rank 0 waits for the other ranks' dumps before listing who is silent."""


class Watchdog:
    def __init__(self, out_dir: Path, rank: int, world_size: int, *, factor: float,
                 floor_s: float, ceiling_s: float) -> None:
        self.folder = Path(out_dir) / "hang"
        self.rank, self.world_size = rank, world_size
        self.factor, self.floor_s, self.ceiling_s = factor, floor_s, ceiling_s
        self.step = 0
        self._last = time.monotonic()
        self._step_times: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpcdp-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int | None = None, step_time_s: float | None = None) -> None:
        """Progress: a step finished (with its time), or an evaluation or checkpoint did."""
        self._last = time.monotonic()
        if step is not None:
            self.step = step
        if step_time_s is not None:
            self._step_times.append(step_time_s)

    def bound_s(self) -> float:
        if len(self._step_times) < 3:
            return self.ceiling_s
        median = statistics.median(self._step_times[-100:])
        return min(self.ceiling_s, max(self.factor * median, self.floor_s))

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            idle = time.monotonic() - self._last
            if idle > self.bound_s():
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        host = socket.gethostname()
        cause = (f"train: WATCHDOG: rank {self.rank} on {host} saw no progress for {idle:.0f} s "
                 f"after step {self.step} (bound {self.bound_s():.0f} s); stacks in "
                 f"{self.folder}; ending this rank so that the job ends")
        print(cause, file=sys.stderr, flush=True)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / f"rank-{self.rank}.txt", "w") as f:
                f.write(f"{cause}\npid {os.getpid()}\n\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            if self.rank == 0:
                time.sleep(SUMMARY_WAIT_S)
                self._write_summary(host)
        finally:
            os._exit(HANG_EXIT)

    def _write_summary(self, host: str) -> None:
        dumped = {int(p.stem.split("-")[1]) for p in self.folder.glob("rank-*.txt")}
        silent = [r for r in range(self.world_size) if r not in dumped]
        (self.folder / "summary.txt").write_text(
            f"no progress after step {self.step}; rank 0 on {host} timed out.\n"
            f"ranks with a stack dump: {sorted(dumped)}\n"
            f"silent ranks (stopped, dead, or stuck where no thread runs): {silent}\n")
