"""Why a job failed, read from its log, in the one line a user acts on: a node that stopped
responding (NODE_FAIL), or out of memory.

One reading for every place that reports a failed job: the job script prints it at the end of
its log (`python -m hpcdp.job_end LOG`), and `hpcdp status`, `submit --wait` and harvest print
the same line. No torch, no Slurm command: only the log's text (and sacct's state when known).

Out of memory reaches the log in one of three ways, all read here:
- Slurm enforced the job's memory (--mem) through jobacct_gather's OverMemoryKill (sites
  without cgroups, and the local cluster): "slurmstepd-NODE: error: StepId=J.S exceeded memory
  limit (USED > LIMIT), being killed";
- through cgroups: "Detected N oom-kill event(s) in StepId=..." and srun's "task R: Out Of
  Memory" (sacct then says OUT_OF_MEMORY);
- no limit at all: the kernel's OOM killer sends the rank SIGKILL, and all srun says is
  "srun: error: NODE: task R: Killed". A SIGKILL with no other cause in the log (not the hang
  watchdog, a time limit, a cancel, a preemption or a node failure) is named as out of memory,
  the usual sender; the line says that this is what it was read from.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 256 * 1024
"""What is read of a log: srun's and slurmstepd's lines come at the end of a launch."""

OOM_ADVICE = ("try fewer ranks per node, a sharded strategy (fsdp, zero1) or a smaller "
              "train.micro_batch_size")

# "srun: error: node2: task 7: Killed", "srun: error: node1: tasks 0-1: Killed",
# "srun: error: node2: task 7: Out Of Memory", "srun: error: node1: task 0: Exited with exit code 1"
_TASK_END = re.compile(r"^srun: error: (?P<node>[^:\s]+): tasks? (?P<ranks>[0-9][0-9,-]*): "
                       r"(?P<how>Killed|Out Of Memory|Exited with exit code \d+|.+)$", re.M)
_OVER_LIMIT = re.compile(r"^slurmstepd(?:-(?P<node>[^:\s]+))?: error: (?:StepId=\S+ exceeded "
                         r"memory limit \((?P<used>\d+) > (?P<limit>\d+)\)"
                         r"|Detected \d+ oom[-_]kill event)", re.M | re.I)
SIGKILL_EVIDENCE = ("nothing else in the log explains the SIGKILL (no watchdog, time limit, "
                    "cancel, preemption or node failure), and the kernel's out-of-memory killer "
                    "sends one")
# A SIGKILL for one of these reasons is not out of memory.
_OTHER_KILLERS = re.compile(r"DUE TO TIME LIMIT|DUE TO PREEMPTION|DUE TO NODE FAIL|"
                            r"CANCELLED AT .* DUE TO|WATCHDOG|the progress watchdog|went silent|"
                            r"SIGTERM \(preemption or scancel\)")


# A planned stop (the job script's lines, templates/base.sbatch.j2): the ranks checkpointed and
# exited 143 on a time limit's USR2 or a preemption's TERM, and srun and slurmstepd report that
# stop in their own words, with "error". Those words are then not errors.
_PLANNED_STOP = re.compile(r"^hpcdp: (?:time limit near: checkpointing|the ranks stopped after a "
                           r"checkpoint)", re.M)
_STOP_REPORTS = re.compile(r"^srun: error: [^:\s]+: tasks? [0-9][0-9,-]*: Exited with exit code "
                           r"143$|^slurmstepd(?:-[^:\s]+)?: error: \*\*\* STEP \S+ ON \S+ "
                           r"CANCELLED AT \S+ \*\*\*$")


def planned_stop_reports(text: str) -> set[str]:
    """The lines of a log that report a planned stop (a checkpoint, then exit 143), when the
    job script says it planned one; empty otherwise."""
    if not _PLANNED_STOP.search(text):
        return set()
    return {line.strip() for line in text.splitlines() if _STOP_REPORTS.match(line.strip())}


@dataclass(frozen=True)
class OutOfMemory:
    rank: str | None
    """srun's task id(s): the ranks (SLURM_PROCID)."""
    node: str | None
    evidence: str
    certain: bool = True
    """Slurm or the kernel said so; False: read from a SIGKILL alone, so named as likely."""

    def line(self) -> str:
        parts = []
        if self.rank:
            parts.append(f"rank{'s' if re.search('[-,]', self.rank) else ''} {self.rank}")
        if self.node:
            parts.append(f"on {self.node}")
        where = f" ({' '.join(parts)})" if parts else ""
        if not self.certain:
            return (f"killed by SIGKILL{where}: out of memory is the likely cause: "
                    f"{self.evidence}; {OOM_ADVICE}")
        return f"out of memory{where}: {self.evidence}; {OOM_ADVICE}"


def _gib(n: str) -> str:
    size = int(n)
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def out_of_memory(text: str, state: str | None = None) -> OutOfMemory | None:
    """The out-of-memory death in a log's text (state: sacct's, when known), or None."""
    ends = list(_TASK_END.finditer(text))
    over = _OVER_LIMIT.search(text)
    if over:
        node = over["node"]
        task = next((m for m in ends if node in (None, m["node"])), None)
        evidence = (f"the step used {_gib(over['used'])}, over the job's memory limit of "
                    f"{_gib(over['limit'])} (--mem), and Slurm killed it"
                    if over["used"] else "Slurm's cgroup counted an out-of-memory kill")
        return OutOfMemory(task["ranks"] if task else None, node or (task and task["node"]),
                           evidence)
    said = next((m for m in ends if m["how"] == "Out Of Memory"), None)
    if said or state == "OUT_OF_MEMORY":
        return OutOfMemory(said and said["ranks"], said and said["node"],
                           "Slurm reports OUT_OF_MEMORY")
    first = ends[0] if ends else None
    if first and first["how"] == "Killed" and not _OTHER_KILLERS.search(text):
        return OutOfMemory(first["ranks"], first["node"], SIGKILL_EVIDENCE, certain=False)
    return None


# The job script's own line (templates/base.sbatch.j2: node_failure), else srun's and
# slurmstepd's: "srun: error: Node failure on node2", "... CANCELLED AT ... DUE TO NODE FAILURE".
_NODE_FAILURE_SAID = re.compile(r"^hpcdp: (?P<line>\S+ stopped responding \(Slurm: NODE_FAIL\).*)$",
                                re.M)
_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (?P<node>\S+)$|DUE TO NODE FAILURE",
                           re.M)


def node_failure(text: str, state: str | None = None) -> str | None:
    """The line for a job that a node's failure ended (Slurm requeues such a job itself), or
    None. Never a preemption, a scancel or a failure of the strategy."""
    said = list(_NODE_FAILURE_SAID.finditer(text))
    if said:
        return said[-1]["line"]
    found = [m["node"] for m in _NODE_FAILURE.finditer(text) if m["node"]]
    if _NODE_FAILURE.search(text) or state == "NODE_FAIL":
        who = ",".join(dict.fromkeys(found)) or "a node"
        return f"{who} stopped responding (Slurm: NODE_FAIL); not a failure of the strategy"
    return None


def read_tail(path: Path) -> str | None:
    """The end of a log (TAIL_BYTES), or None when it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - TAIL_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def why_failed(log: Path, state: str | None = None) -> str | None:
    """The one line for a failed job whose log is `log`, or None when the log says nothing
    this module can name."""
    text = read_tail(log) or ""
    failed_node = node_failure(text, state)
    if failed_node:
        return failed_node
    found = out_of_memory(text, state)
    return found.line() if found else None


def main(argv: list[str]) -> int:
    """`python -m hpcdp.job_end LOG`: the job script's last word on a failed launch."""
    if len(argv) != 1:
        print("usage: python -m hpcdp.job_end LOG", file=sys.stderr)
        return 2
    line = why_failed(Path(argv[0]))
    if line:
        print(f"hpcdp: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
