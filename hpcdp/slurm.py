"""Job states from Slurm: one `squeue` call for live jobs, one `sacct` call for the rest.

Shared by `hpcdp status`, `hpcdp submit --wait` and `hpcdp harvest`. Pure Python, no torch; the
client commands find the cluster through SLURM_CONF in the environment (or `env=`).

Why two commands (docs/harvest.md, "Job states"):
- squeue is the controller's live view, but forgets a job a few minutes after it ends.
- sacct is the accounting database: it remembers every job, but lags squeue by up to ~5 s
  (slurmctld sends records every 5 s), and it exists only where slurmdbd runs. Its exit codes
  are read from the text output ("3:0"); `sacct --json` in 22.05 reports 0 for plain non-zero
  exits. A requeue shows only with --duplicates: REQUEUED, then the rerun.
- Lag rule: a job that squeue no longer shows while sacct still says RUNNING/PENDING (or any
  other non-final state) has ended and its final record is on the way: it is reported as
  "ENDING" (provisional). Only sacct's later answer is final.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

# States after which a job will not run again (unless someone requeues it by hand).
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
    "BOOT_FAIL", "DEADLINE",
})
ENDING = "ENDING"
"""Provisional: squeue no longer shows the job, sacct has not recorded its end yet."""
UNKNOWN = "UNKNOWN"
"""Neither squeue nor sacct knows the id (wrong cluster, purged, or not submitted)."""

JOB_LOG = "slurm-{job_id}.out"
"""A job's log in its run directory: the rendered script sends its output there, `hpcdp submit`
and harvest look for it there."""


def job_log_name(job_id: str) -> str:
    return JOB_LOG.format(job_id=job_id)


# Client commands must not hang `hpcdp status`: sacct retries a missing config for 60 s.
COMMAND_TIMEOUT_S = 30.0

_SQUEUE_FIELDS = ("JobID", "State", "TimeUsed", "NodeList", "NumNodes", "StartTime", "EndTime",
                  "RestartCnt", "Reason")
_SACCT_FIELDS = ("JobID", "State", "ExitCode", "ElapsedRaw", "NodeList", "NNodes", "Start", "End",
                 "MaxRSS")
_NO_VALUE = {"", "N/A", "NONE", "None", "Unknown", "(null)", "None assigned"}


@dataclass
class JobInfo:
    """What Slurm says about one job. `source` tells which command answered."""

    job_id: str
    state: str
    """Normalized: first word, upper case ("CANCELLED by 0" -> "CANCELLED"); or ENDING/UNKNOWN."""
    exit_code: int | None = None
    """The job's exit code (sacct's "3:0" -> 3); None while live or when unknown."""
    elapsed_s: float | None = None
    node_list: str | None = None
    num_nodes: int | None = None
    start: str | None = None
    """ISO time as Slurm prints it, or None when not started / unknown."""
    end: str | None = None
    restarts: int | None = None
    """Requeues: squeue's RestartCnt, or the number of earlier sacct records (--duplicates)."""
    earlier_elapsed_s: float = 0.0
    """Time of the segments before a requeue (sacct --duplicates): the run's time is
    `run_elapsed_s`, elapsed_s is the current segment's only."""
    max_rss: str | None = None
    """Largest MaxRSS over the job's steps, as sacct prints it (e.g. "10524K"); None if unset."""
    source: Literal["squeue", "sacct", "none"] = "none"
    signal: int | None = None
    """The signal that ended the job (sacct's "0:15" -> 15), when one did."""
    raw_state: str | None = None
    """The state exactly as Slurm printed it, e.g. "CANCELLED by 0"."""
    reason: str | None = None
    """Why a live job waits (squeue's Reason, e.g. PartitionNodeLimit); None when it does not."""

    @property
    def run_elapsed_s(self) -> float | None:
        """The job's time over every segment, requeues included."""
        return None if self.elapsed_s is None else self.elapsed_s + self.earlier_elapsed_s

    def shown_state(self) -> str:
        """The state, with Slurm's reason while it is pending: "PENDING (Resources)"."""
        return f"{self.state} ({self.reason})" if self.reason and self.state == "PENDING" \
            else self.state


class JobTable(dict):
    """`query_jobs`' answer: job id -> JobInfo, plus whether accounting could be asked.

    accounting_available: True/False when sacct was asked; None when it was not needed (every
    job was live in squeue). accounting_message says why it is unavailable.
    """

    accounting_available: bool | None = None
    accounting_message: str = ""


def normalize_state(raw: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'; 'cancelled+' (a cut column) -> 'CANCELLED'."""
    words = raw.strip().split()
    return words[0].rstrip("+").upper() if words else UNKNOWN


def is_terminal(state: str) -> bool:
    """True for final states (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...); accepts raw text."""
    return normalize_state(state) in TERMINAL_STATES


def parse_exit_code(text: str) -> tuple[int | None, int | None]:
    """sacct's 'CODE:SIGNAL' -> (code, signal or None). '3:0' -> (3, None); '0:15' -> (0, 15)."""
    code, sep, signal = text.strip().partition(":")
    try:
        exit_code = int(code)
    except ValueError:
        return None, None
    try:
        sig = int(signal) if sep else 0
    except ValueError:
        sig = 0
    return exit_code, (sig or None)


def parse_duration(text: str) -> float | None:
    """Slurm's [D-][HH:]MM:SS (squeue TimeUsed) -> seconds; None for 'INVALID' and the like."""
    text = text.strip()
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?", text)
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def rss_bytes(text: str | None) -> float:
    """sacct's MaxRSS ('10524K', '1.5G', '123') -> bytes, for comparing; 0 when unset."""
    if not text:
        return 0.0
    match = re.fullmatch(r"([\d.]+)([KMGTP]?)", text.strip())
    if not match:
        return 0.0
    scale = 1024 ** " KMGTP".index(match.group(2) or " ")
    return float(match.group(1)) * scale


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text in _NO_VALUE else text


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """Parse `squeue --noheader -O JobID:|,State:|,...` output (fields _SQUEUE_FIELDS)."""
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(_SQUEUE_FIELDS) - 1:  # Reason, the last field, may be absent
            continue
        job_id, state, used, nodes, num_nodes, start, end, restarts, reason = (
            [p.strip() for p in parts[:len(_SQUEUE_FIELDS)]] + [""])[:len(_SQUEUE_FIELDS)]
        if not job_id:
            continue
        jobs[job_id] = JobInfo(
            job_id=job_id, state=normalize_state(state), raw_state=state,
            elapsed_s=parse_duration(used), node_list=_value(nodes), num_nodes=_int(num_nodes),
            start=_value(start), end=_value(end), restarts=_int(restarts), source="squeue",
            reason=_value(reason),
        )
    return jobs


def parse_sacct(text: str) -> dict[str, JobInfo]:
    """Parse `sacct --parsable2 --noheader --duplicates --format=<_SACCT_FIELDS>` output.

    Lines without a '.' in the JobID are allocations; the step lines that follow one
    (ID.batch, ID.0, ...) belong to it and only feed max_rss. With --duplicates a requeued job
    has several allocation records in order (REQUEUED ..., then the rerun): the last one is
    the job's state, the earlier ones count as restarts.
    """
    records: dict[str, list[JobInfo]] = {}
    current: JobInfo | None = None
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(_SACCT_FIELDS):
            continue
        job_id, state, exit_text, elapsed, nodes, num_nodes, start, end, max_rss = (
            p.strip() for p in parts[:len(_SACCT_FIELDS)])
        if not job_id:
            continue
        if "." in job_id:  # a step of the allocation above
            owner = job_id.split(".", 1)[0]
            if current is not None and current.job_id == owner and rss_bytes(max_rss) > rss_bytes(
                    current.max_rss):
                current.max_rss = max_rss
            continue
        exit_code, signal = parse_exit_code(exit_text)
        current = JobInfo(
            job_id=job_id, state=normalize_state(state), raw_state=state, exit_code=exit_code,
            signal=signal, elapsed_s=float(elapsed) if elapsed.isdigit() else None,
            node_list=_value(nodes), num_nodes=_int(num_nodes), start=_value(start),
            end=_value(end), max_rss=_value(max_rss), source="sacct",
        )
        records.setdefault(job_id, []).append(current)
    jobs = {}
    for job_id, runs in records.items():
        final = runs[-1]
        final.restarts = len(runs) - 1
        final.earlier_elapsed_s = sum(r.elapsed_s or 0.0 for r in runs[:-1])
        jobs[job_id] = final
    return jobs


def _run(argv: list[str], env: Mapping[str, str] | None) -> tuple[int, str, str]:
    """Run a client command: (returncode, stdout, stderr); 127 when missing, 124 on timeout."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                              env=dict(env) if env is not None else None,
                              timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S:.0f} s"
    return proc.returncode, proc.stdout, proc.stderr


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def squeue(job_ids: list[str], env: Mapping[str, str] | None = None
           ) -> tuple[dict[str, JobInfo], bool]:
    """Live jobs among `job_ids` (one call) and whether squeue answered at all."""
    if not job_ids:
        return {}, True
    fmt = ",".join(f"{name}:|" for name in _SQUEUE_FIELDS)
    rc, out, err = _run(["squeue", "--noheader", f"--jobs={','.join(job_ids)}", f"--Format={fmt}"],
                        env)
    if rc != 0:
        # A single id that the controller has forgotten is an error for squeue, not "no jobs".
        if "Invalid job id" in err:
            return {}, True
        return {}, False
    wanted = set(job_ids)
    return {k: v for k, v in parse_squeue(out).items() if k in wanted}, True


def sacct(job_ids: list[str], env: Mapping[str, str] | None = None
          ) -> tuple[dict[str, JobInfo], bool, str]:
    """Accounting records of `job_ids` (one call): (jobs, accounting available, why not)."""
    if not job_ids:
        return {}, True, ""
    rc, out, err = _run([
        "sacct", "--noheader", "--parsable2", "--duplicates", f"--jobs={','.join(job_ids)}",
        f"--format={','.join(_SACCT_FIELDS)}",
    ], env)
    if rc != 0:
        reason = _last_line(err) or f"sacct exited with {rc}"
        return {}, False, reason
    wanted = set(job_ids)
    return {k: v for k, v in parse_sacct(out).items() if k in wanted}, True, ""


def query_jobs(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> JobTable:
    """State of every job id: one squeue call for all of them, one sacct call for the rest.

    Ids neither command knows come back with state UNKNOWN (source "none"). Where sacct is
    unavailable (accounting disabled, an error, the command missing) the answer holds what
    squeue knows and `.accounting_available` is False.
    """
    ids = list(dict.fromkeys(str(j).strip() for j in job_ids if str(j).strip()))
    live, squeue_ok = squeue(ids, env)
    rest = [j for j in ids if j not in live]
    ended, available, reason = sacct(rest, env) if rest else ({}, None, "")
    requeued = [j for j, info in live.items() if info.restarts]
    if requeued:  # squeue knows the current segment's time only; sacct the earlier ones'
        for job_id, record in sacct(requeued, env)[0].items():
            live[job_id].earlier_elapsed_s = record.earlier_elapsed_s
    table = merge(ids, live, squeue_ok, ended)
    table.accounting_available = available
    table.accounting_message = reason
    return table


def merge(ids: list[str], live: dict[str, JobInfo], squeue_ok: bool,
          ended: dict[str, JobInfo]) -> JobTable:
    """Combine squeue's and sacct's answers (pure: the lag rule lives here, tested on its own)."""
    table = JobTable()
    for job_id in ids:
        if job_id in live:
            table[job_id] = live[job_id]
        elif job_id in ended:
            info = ended[job_id]
            if squeue_ok and not is_terminal(info.state):
                info.state = ENDING  # gone from squeue, final record not in sacct yet
            table[job_id] = info
        else:
            table[job_id] = JobInfo(job_id=job_id, state=UNKNOWN, source="none")
    return table


def cancel(job_ids: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """scancel the jobs; None when it worked, else scancel's reason."""
    rc, _, err = _run(["scancel", *job_ids], env)
    return None if rc == 0 else (_last_line(err) or f"scancel exited with {rc}")


def has_ended(info: JobInfo, accounting_available: bool | None) -> bool:
    """Whether to stop waiting for a job: sacct gave a final state, or (without accounting)
    squeue no longer shows it, so no final record will ever come."""
    if info.source == "sacct" and is_terminal(info.state):
        return True
    return info.source == "none" and accounting_available is False


def partition_node_limit(partition: str | None, env: Mapping[str, str] | None = None
                         ) -> tuple[str, int, str] | None:
    """(partition, most nodes one job can get there, why) from `scontrol show partition`: the
    smaller of TotalNodes and MaxNodes. `partition` None means the default partition. None
    when Slurm cannot tell (no scontrol, no such partition, another cluster's rules)."""
    fields = _partition_fields(partition, env)
    total = _int(fields.get("TotalNodes", "")) if fields else None
    if total is None:
        return None
    max_nodes = _int(fields.get("MaxNodes", ""))  # UNLIMITED -> None
    name = fields.get("PartitionName", partition or "?")
    if max_nodes is not None and max_nodes < total:
        return name, max_nodes, f"MaxNodes={max_nodes}"
    return name, total, f"{total} nodes in all"


def _partition_fields(partition: str | None, env: Mapping[str, str] | None) -> dict | None:
    """`scontrol show partition`'s KEY=VALUE fields of `partition` (None: the default one), or
    None when Slurm cannot tell (no scontrol, no such partition)."""
    rc, out, _ = _run(["scontrol", "show", "partition", "--oneliner",
                       *([partition] if partition else [])], env)
    if rc != 0:
        return None
    for line in out.splitlines():
        fields = dict(item.partition("=")[::2] for item in line.split())
        if partition is not None or fields.get("Default") == "YES":
            return fields
    return None


def _node_fields(partition_fields: dict | None, env: Mapping[str, str] | None) -> list[dict]:
    """`scontrol show node`'s KEY=VALUE fields of each node of a partition (its
    _partition_fields); empty when Slurm cannot tell."""
    nodes = (partition_fields or {}).get("Nodes")
    if not nodes:
        return []
    rc, shown, _ = _run(["scontrol", "show", "node", "--oneliner", nodes], env)
    found = [dict(i.partition("=")[::2] for i in n.split()) for n in shown.splitlines()]
    return [f for f in found if f.get("NodeName")] if rc == 0 else []


def partition_and_nodes(partition: str | None, env: Mapping[str, str] | None = None
                        ) -> tuple[dict, list[dict]] | None:
    """`scontrol show partition`'s fields of `partition` (None: the default one) and `show
    node`'s of each of its nodes; None when Slurm does not know the partition."""
    fields = _partition_fields(partition, env)
    return None if fields is None else (fields, _node_fields(fields, env))


def partition_names(env: Mapping[str, str] | None = None) -> list[str]:
    """Every partition sinfo lists; empty when Slurm cannot tell."""
    rc, out, _ = _run(["sinfo", "-h", "-o", "%R"], env)
    return sorted(set(out.split())) if rc == 0 else []


def select_type(env: Mapping[str, str] | None = None) -> str | None:
    """The cluster's SelectType (select/cons_tres, ...) from `scontrol show config`."""
    rc, out, _ = _run(["scontrol", "show", "config"], env)
    found = re.search(r"^SelectType\s*=\s*(\S+)", out, re.M) if rc == 0 else None
    return found[1] if found else None


def partition_node_addresses(partition: str | None, env: Mapping[str, str] | None = None
                             ) -> list[str] | None:
    """Each node's NodeAddr in `partition` (None: the default one), from `scontrol show`;
    None when Slurm cannot tell."""
    found = _node_fields(_partition_fields(partition, env), env)
    return [f.get("NodeAddr") or f["NodeName"] for f in found] or None


def partition_billing(partition: str | None, env: Mapping[str, str] | None = None
                      ) -> dict | None:
    """The partition's TRESBillingWeights and what one whole node of it holds, from `scontrol
    show partition` (and `show node` for its memory): {"partition", "weights": {TRES: weight},
    "cpus_per_node", "mem_gb_per_node"}; "weights" is empty where none are set (Slurm then
    bills 1 per CPU: said by the caller). None when Slurm cannot tell."""
    fields = _partition_fields(partition, env)
    if fields is None:
        return None
    nodes = _int(fields.get("TotalNodes", "")) or 0
    cpus = _int(fields.get("TotalCPUs", "")) or 0
    mems = [m for f in _node_fields(fields, env) if (m := _int(f.get("RealMemory", "")))]
    mem_gb = min(mems) / 1000 if mems else None  # MB
    return {"partition": fields.get("PartitionName", partition or "?"),
            "weights": _billing_weights(fields.get("TRESBillingWeights", "")),
            "cpus_per_node": cpus / nodes if nodes else None, "mem_gb_per_node": mem_gb}


def _billing_weights(text: str) -> dict[str, float]:
    """TRESBillingWeights ("CPU=1.0,Mem=0.25G,GRES/gpu=2.0") as {tres: weight}, Mem's per GB
    (Slurm's is per MB unless suffixed)."""
    per_gb = {"k": 1e6, "m": 1e3, "g": 1.0, "t": 1e-3}
    weights = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        key = key.lower()
        scale = per_gb["m"] if key == "mem" else 1.0
        if key == "mem" and value[-1:].lower() in per_gb:
            scale, value = per_gb[value[-1].lower()], value[:-1]
        try:
            weights[key] = float(value) * scale
        except ValueError:
            continue
    return weights


def job_billing(job_id: str, env: Mapping[str, str] | None = None) -> dict | None:
    """A job's billed TRES and energy as sacct records them: {"billing": units per hour of the
    allocation (AllocTRES billing=N), "elapsed_s", "energy_j" (None: not recorded),
    "partition" (where it ran; None if sacct does not say)}."""
    rc, out, _ = _run(["sacct", "-j", str(job_id), "-X", "-n", "-P",
                       "-o", "AllocTRES,ElapsedRaw,ConsumedEnergyRaw,Partition"], env)
    if rc != 0 or not out.strip():
        return None
    tres, elapsed, energy, partition = (out.strip().splitlines()[0].split("|") + [""] * 4)[:4]
    billing = dict(i.partition("=")[::2] for i in tres.split(",") if "=" in i).get("billing")
    energy_j = _int(energy)
    return {"billing": float(billing) if billing else None, "elapsed_s": _int(elapsed),
            "energy_j": energy_j or None, "partition": partition or None}
