"""The progress watchdog: a rank that sees no training step finish for too long writes every
thread's Python stack into RUN_DIR/hang/, says which ranks went silent, and ends itself, so
that srun (--kill-on-bad-exit) ends the job FAILED instead of letting it hang to its limit.

It bounds every hang, whatever blocks: a stopped or dead peer inside an MPI collective (which
no timeout of Horovod's MPI controller bounds), a deadlock, a stuck file system. The bound is
max(hang_factor x median step time, hang_floor_s), never more than dist_timeout_s (which also
bounds torch's collectives and Horovod's Gloo and stall shutdown), and dist_timeout_s until a
few steps have given a median.

Every rank records where it runs (RUN_DIR/ranks/rank-R.json: pid, machine, Slurm node, device,
CUDA_VISIBLE_DEVICES and the device `hpcdp env` predicts from it) when it
starts. A rank that fires dumps its own stack; the lowest rank that fired then names the silent
ranks and their nodes (hang/summary.txt, hang/silent_nodes for the batch script's
`train.on_hang: requeue`), and reads the silent ranks' stacks with py-spy where it is installed
and the silent rank runs on the same machine (a stopped process cannot dump its own).

A network partition leaves both sides alive, each waiting for the other: so every rank that
fires first tries the Slurm controller (a TCP connection to slurm.conf's SlurmctldHost), and the
summary names the nodes whose ranks could not reach it as cut off, and the others as having
only waited for them. (A node cut off from a real cluster's shared file system cannot write its
dump either, and is named silent.)

Slurm may end the job first: when it declares the cut node failed, it sends the others SIGTERM
and, KillWait seconds later, SIGKILL. A rank blocked in a collective runs no Python signal
handler until the collective returns, so the watchdog thread hears the signal itself (the
interpreter writes each signal to a pipe: signal.set_wakeup_fd), and a rank that SIGTERM finds
stuck (no progress for STUCK_AT_TERM_S and 3 median steps) dumps its stack into hang/ at once.
A rank making progress does not: it is stopping as asked (a preemption's checkpoint).
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HANG_EXIT = 124
"""Exit code of a rank the watchdog ended (as timeout(1) uses it)."""
SUMMARY_WAIT_S = 3.0
"""How long a rank that fired waits for the other ranks' dumps before listing who is silent."""
SUMMARY_DEADLINE_S = 30.0
"""How long the other ranks stay alive for the summary (srun ends the step when one exits)."""
PY_SPY_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 2.0
"""How long a rank that fired tries to reach the Slurm controller (well inside SUMMARY_WAIT_S)."""
SLURMCTLD_DEFAULT_PORT = 6817
STUCK_AT_TERM_S = 5.0
"""A rank SIGTERM finds without progress for this long (and 3 median steps) dumps its stack."""


class Watchdog:
    def __init__(self, out_dir: Path, rank: int, world_size: int, *, factor: float,
                 floor_s: float, ceiling_s: float, placement: dict | None = None) -> None:
        self.folder = Path(out_dir) / "hang"
        self.rank, self.world_size = rank, world_size
        self.factor, self.floor_s, self.ceiling_s = factor, floor_s, ceiling_s
        self.step = 0
        self._last = time.monotonic()
        self._step_times: list[float] = []
        self._grace = False
        self._done = threading.Event()
        self._signals = _signal_pipe()
        self._record_where_this_rank_runs(placement or {})
        self._thread = threading.Thread(target=self._watch, name="hpcdp-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int | None = None, step_time_s: float | None = None) -> None:
        """Progress: a step finished (with its time), or an evaluation or checkpoint did."""
        self._last = time.monotonic()
        self._grace = False
        if step is not None:
            self.step = step
        if step_time_s is not None:
            self._step_times.append(step_time_s)

    def grace(self) -> None:
        """Until the next beat, the bound is the ceiling: for work slower than a step that is
        not a hang (an evaluation, whose first run under train.compile compiles its graph)."""
        self._grace = True

    def bound_s(self) -> float:
        if len(self._step_times) < 3 or self._grace:
            return self.ceiling_s
        median = statistics.median(self._step_times[-100:])
        return min(self.ceiling_s, max(self.factor * median, self.floor_s))

    def _record_where_this_rank_runs(self, placement: dict) -> None:
        if self.rank == 0 and self.folder.exists():  # an earlier job's hang: keep it aside
            n = 1
            while self.folder.with_name(f"hang.{n}").exists():
                n += 1
            self.folder.rename(self.folder.with_name(f"hang.{n}"))
        ranks = self.folder.parent / "ranks"
        ranks.mkdir(parents=True, exist_ok=True)
        where = {"rank": self.rank, "pid": os.getpid(), "machine": socket.gethostname(),
                 "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                 **placement}
        (ranks / f"rank-{self.rank}.json").write_text(json.dumps(where) + "\n")

    def stop(self) -> None:
        self._done.set()
        if self._signals is not None:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:  # not the main thread: the interpreter keeps the pipe
                pass

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._signals is None:
                self._done.wait(0.5)
            elif select.select([self._signals], [], [], 0.5)[0]:
                if signal.SIGTERM in os.read(self._signals, 64) and not self._done.is_set():
                    self._terminated()
            idle = time.monotonic() - self._last
            if idle > self.bound_s() and not self._done.is_set():  # stopped while it waited
                self._fire(idle)

    def _terminated(self) -> None:
        """SIGTERM arrived: a rank stuck in a collective leaves its stack before it is killed."""
        idle = time.monotonic() - self._last
        median = statistics.median(self._step_times[-100:]) if self._step_times else 0.0
        if idle > max(STUCK_AT_TERM_S, 3 * median):  # KillWait is short: the stack alone
            self._write_stack(f"train: rank {self.rank} on {socket.gethostname()} got SIGTERM "
                              f"after {idle:.0f} s without progress (after step {self.step}): "
                              "its stack before the job ends")

    def _dump(self, cause: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Before the dump: the rank writing the summary reads this once it sees the dump.
        (self.folder / f"rank-{self.rank}.network").write_text(
            describe_reach(slurm_controller()) + "\n")
        self._write_stack(cause)

    def _write_stack(self, cause: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"rank-{self.rank}.txt", "w") as f:
            f.write(f"{cause}\npid {os.getpid()}\n\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)

    def _fire(self, idle: float) -> None:
        host = socket.gethostname()
        cause = (f"train: WATCHDOG: rank {self.rank} on {host} saw no progress for {idle:.0f} s "
                 f"after step {self.step} (bound {self.bound_s():.0f} s); stacks in "
                 f"{self.folder}; ending this rank so that the job ends")
        print(cause, file=sys.stderr, flush=True)
        try:
            self._dump(cause)
            time.sleep(SUMMARY_WAIT_S)
            if self.rank == min(self._dumped()):
                self._write_summary(host)
            else:  # stay until the summary is written: our exit would end the step
                deadline = time.monotonic() + SUMMARY_DEADLINE_S
                while not (self.folder / "summary.txt").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
        finally:
            os._exit(HANG_EXIT)

    def _dumped(self) -> set[int]:
        # rank-N.txt: the rank's own dump (not rank-N.py-spy.txt, a stack read from outside)
        return {int(p.stem[len("rank-"):]) for p in self.folder.glob("rank-*.txt")
                if p.stem[len("rank-"):].isdigit()}

    def _write_summary(self, host: str) -> None:
        dumped = self._dumped()
        silent = [r for r in range(self.world_size) if r not in dumped]
        where = {r: _where(self.folder.parent / "ranks" / f"rank-{r}.json")
                 for r in range(self.world_size)}
        node = {r: (where[r] or {}).get("node", "?") for r in where}
        nodes = sorted({node[r] for r in silent if where[r]})
        cut = [r for r in sorted(dumped) if self._reach(r).startswith("cannot reach")]
        cut_nodes = sorted({node[r] for r in cut})
        for rank in silent:
            w, out = where[rank], self.folder / f"rank-{rank}.py-spy.txt"
            if not w:
                out.write_text(f"rank {rank} recorded no pid: no stack\n")
            elif w["machine"] != socket.gethostname():
                out.write_text(f"rank {rank} runs on {w['machine']}, not on {host} where this "
                               "was written: py-spy cannot reach it, no stack\n")
            else:
                _py_spy(w["pid"], out)
        faulty = sorted(set(nodes) | set(cut_nodes))
        (self.folder / "silent_nodes").write_text(",".join(faulty) + "\n" if faulty else "")
        (self.folder / "summary.txt").write_text(
            f"no progress after step {self.step}; rank {self.rank} on {host} wrote this.\n"
            f"ranks with a stack dump: {sorted(dumped)}\n"
            f"silent ranks (stopped, dead, or stuck where no thread runs): {silent}\n"
            f"silent nodes: {', '.join(nodes) or '-'}\n"
            + self._partition_lines(dumped, silent, cut, cut_nodes, node))

    def _reach(self, rank: int) -> str:
        try:
            return (self.folder / f"rank-{rank}.network").read_text().strip()
        except OSError:
            return "not recorded"

    def _partition_lines(self, dumped: set[int], silent: list[int], cut: list[int],
                         cut_nodes: list[str], node: dict[int, str]) -> str:
        """What the network says: which nodes were cut off, and who only waited for them."""
        if cut:
            waited = [r for r in sorted(dumped) if r not in cut]
            return (f"cut off: {', '.join(cut_nodes)} (its ranks {cut} cannot reach the Slurm "
                    f"controller: a link or switch port down, or the node's network)\n"
                    f"ranks that only waited for it: {waited} on "
                    f"{', '.join(sorted({node[r] for r in waited})) or '-'}\n")
        if not silent and len(dumped) > 1:
            return ("every rank is alive (each dumped its stack) and none was found cut off "
                    "from the Slurm controller: each side saw the others silent (a partition "
                    "between the nodes alone, or ranks waiting on each other)\n")
        return ""


def _signal_pipe() -> int | None:
    """The read end of a pipe the interpreter writes each arriving signal's number to, or None
    where it cannot be set (not the main thread)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:
        os.close(read)
        os.close(write)
        return None
    return read


def slurm_controller(conf: str | None = None) -> tuple[str, int] | None:
    """(address, port) of the Slurm controller from slurm.conf ($SLURM_CONF, else Slurm's
    default path); None where there is none to ask: outside a Slurm job (`hpcdp run`'s local
    processes, whose machine may have a slurm.conf of no use to them), a configless node."""
    if conf is None and not os.environ.get("SLURM_JOB_ID"):
        return None
    path = Path(conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = path.read_text()
    except OSError:
        return None
    host, port = None, SLURMCTLD_DEFAULT_PORT
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        key, value = key.strip().lower(), value.strip()
        if key in ("slurmctldhost", "controlmachine") and host is None and value:
            # HOST or HOST(ADDRESS): the address is what the nodes connect to.
            host = value.split("(", 1)[1].rstrip(")") if "(" in value else value
        elif key == "slurmctldport" and value.split("-")[0].isdigit():
            port = int(value.split("-")[0])
    return (host, port) if host else None


def describe_reach(controller: tuple[str, int] | None) -> str:
    """'reaches|cannot reach the Slurm controller at H:P', or why it was not tried."""
    if controller is None:
        return "no Slurm controller to try (no slurm.conf here)"
    where = f"{controller[0]}:{controller[1]}"
    try:
        with socket.create_connection(controller, timeout=CONNECT_TIMEOUT_S):
            return f"reaches the Slurm controller at {where}"
    except OSError as exc:
        return f"cannot reach the Slurm controller at {where} ({exc.__class__.__name__})"


def _where(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _py_spy(pid: int, out: Path) -> None:
    """A silent rank's stack read from outside (--nonblocking: it works on a stopped process).
    Where py-spy is missing or ptrace is not allowed, the file says why."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        out.write_text("py-spy is not installed: no stack for this rank\n")
        return
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking"],
                              capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S)
        out.write_text(done.stdout + done.stderr)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out.write_text(f"py-spy failed: {exc}\n")
