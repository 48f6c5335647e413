"""Launcher environment variables -> one distributed environment (`DistEnv`).

The one place that reads SLURM_*, torchrun's and horovodrun's variables. `hpcdp env` prints
what it finds; train/ uses it to set up torch.distributed or Horovod. Pure Python (stdlib only,
no torch), and every reader takes the environment as a mapping, so that tests pass real
environments written out as dicts.

`LAUNCHERS` is the table of where each launcher writes rank, sizes and restarts; `_from_launcher`
is the one builder that reads a row. Which launcher started us, first match wins:

1. torchrun: TORCHELASTIC_RUN_ID, or RANK + WORLD_SIZE + MASTER_ADDR all set.
2. horovodrun (Gloo controller, what `hpcdp run` uses for Horovod): HOROVOD_RANK and friends.
3. A Slurm task started by srun (also Horovod over MPI, which the templates start with
   `srun --mpi=...`): SLURM_STEP_ID is set (Slurm 22.05's batch shell has SLURM_PROCID=0 as
   well, so SLURM_PROCID alone does not mean srun).
4. None: a Slurm batch shell without srun, or a plain process. Rank 0 of world 1 with
   `in_step=False`, so that `check_world` can say "run it with srun".

Under any launcher inside a Slurm job, the job id, hosts and (unless MASTER_ADDR is set) the
master address still come from SLURM_*. Heterogeneous jobs and mpirun are not read: no
template renders them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hpcdp.errors import UsageError, one_line
from hpcdp.hostlist import HostlistError, expand_hostlist

__all__ = ["DistEnv", "DistEnvError", "HostlistError", "detect", "expand_hostlist"]

Launcher = Literal["slurm", "torchrun", "horovodrun", "none"]


class DistEnvError(UsageError, ValueError):
    """The environment is inconsistent or malformed; the message names the variable and value.

    A UsageError too, so that `hpcdp env` prints it on one line and exits with code 2.
    """


# --------------------------------------------------------------------------------------------
# Master port

# Ports derived from job ids stay in [20000, 32767]: below Linux's default ephemeral range
# (net.ipv4.ip_local_port_range = 32768-60999), from which the kernel picks the source ports of
# outgoing connections (a port there may be taken by any client at any moment), and above most
# well-known service ports. Consecutive job ids get consecutive ports, so two jobs sharing a
# node collide only when their ids differ by a multiple of 12768.
PORT_RANGE_START = 20000
PORT_RANGE_END = 32767
DEFAULT_MASTER_PORT = 29500  # torch's own default, for runs outside any job
_JOB_ID_RE = re.compile(r"(\d+)(?:_(\d+))?")
_ARRAY_TASK_STRIDE = 7919  # a prime: array tasks of one job spread over the range


def master_port_for_job(job_id: str | int | None) -> int:
    """A port from the job id, the same on every node of the job; None -> 29500.

    `123_4` (array task 4 of job 123, as squeue writes it) gets its own port, since array
    tasks may share a node.
    """
    if job_id is None:
        return DEFAULT_MASTER_PORT
    if isinstance(job_id, bool) or not isinstance(job_id, (int, str)):
        raise DistEnvError(f"job id {job_id!r} must be a number like 123 or 123_4")
    match = _JOB_ID_RE.fullmatch(str(job_id).strip())
    if not match:
        raise DistEnvError(
            f"job id {one_line(str(job_id))!r} is not a Slurm job id; "
            "expected digits like 123 or 123_4 (array task)"
        )
    key = int(match.group(1))
    if match.group(2) is not None:
        key += (int(match.group(2)) + 1) * _ARRAY_TASK_STRIDE
    span = PORT_RANGE_END - PORT_RANGE_START + 1
    return PORT_RANGE_START + key % span


# --------------------------------------------------------------------------------------------
# Containers

# What each runtime leaves in the environment of the process it starts; last, what hpcdp's
# script asked for (Pyxis/enroot set nothing of their own).
_CONTAINER_VARIABLES = (
    ("SLURM_CONTAINER", "oci {}"),  # srun --container=BUNDLE
    ("APPTAINER_CONTAINER", "apptainer {}"),
    ("SINGULARITY_CONTAINER", "apptainer {}"),
    ("HPCDP_CONTAINER", "{}"),  # "RUNTIME IMAGE", exported by the rendered script
)


def _container_variable(environ: dict | None) -> tuple[str, str] | None:
    """(variable, "RUNTIME IMAGE") from the first container variable set, or None."""
    environ = os.environ if environ is None else environ
    for name, form in _CONTAINER_VARIABLES:
        if environ.get(name):
            return name, form.format(environ[name])
    return None


def container_in_use(environ: dict | None = None) -> str | None:
    """The container this process runs in, as its runtime tells (`oci /path/bundle`); None
    when no runtime's variable is set."""
    found = _container_variable(environ)
    return found[1] if found else None


def container_hint(environ: dict | None = None) -> str:
    """container_in_use, saying which variable told, for `hpcdp env`."""
    found = _container_variable(environ)
    return f"{found[1]} ({found[0]})" if found else "none seen (no container variable set)"


# --------------------------------------------------------------------------------------------
# The environment


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job: ranks, sizes, rendezvous and hosts."""

    launcher: Launcher
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    """Host of rank 0 for torch's rendezvous; "" when no launcher variable tells it."""
    master_port: int
    hosts: tuple[str, ...] = ()
    """The step's nodes (the job's, outside srun) in node-rank order; empty outside Slurm."""
    job_id: str | None = None
    restart_count: int = 0
    """Times the job was requeued (SLURM_RESTART_COUNT) or torchrun restarted the workers."""
    cpus_per_task: int | None = None
    network_interface: str | None = None
    """NCCL_SOCKET_IFNAME syntax (e.g. ib0, ^lo,docker); None: let NCCL/Gloo pick."""
    gloo_socket_ifname: str | None = None
    """GLOO_SOCKET_IFNAME as set in the environment (a user's choice wins over the derived one)."""
    in_step: bool = True
    """Whether a launcher started this process as one task of a step. False in a Slurm batch
    shell that srun did not start, and in a plain process with no launcher at all."""
    tasks_per_node: tuple[int, ...] = ()
    """Tasks on each node of the step, by node rank (SLURM_TASKS_PER_NODE, expanded)."""
    job_num_tasks: int | None = None
    """Tasks the Slurm job asked for (SLURM_NTASKS), also in a batch shell without srun."""
    master_addr_source: str = "default"
    """Where master_addr came from, e.g. "MASTER_ADDR (set in the environment)"."""
    master_port_source: str = "default"

    # ---- views -------------------------------------------------------------------------------

    def device_index(self, visible_devices: int) -> int:
        """The device this process drives: local_rank modulo the devices it can see.

        Under `--gpus-per-task=1` (or `--gpu-bind`) every task sees a single GPU, index 0,
        so using LOCAL_RANK as the index would fail on all tasks but the first.
        """
        if visible_devices <= 0:
            return 0
        return self.local_rank % visible_devices

    def device_hint(self, cuda_visible_devices: str | None) -> str:
        """The device train/ will pick, as far as it can be told without importing torch
        (what `hpcdp env` prints, and each rank records in RUN_DIR/ranks/rank-R.json)."""
        if cuda_visible_devices is None:
            return f"cuda:(local rank {self.local_rank} % GPUs) on a GPU node, else cpu"
        ids = [v for v in cuda_visible_devices.split(",") if v.strip()]
        if not ids:
            return "cpu (CUDA_VISIBLE_DEVICES is empty)"
        return f"cuda:{self.device_index(len(ids))} (CUDA_VISIBLE_DEVICES={cuda_visible_devices})"

    def check_visible_devices(self, visible: int, bound: bool) -> None:
        """One GPU per rank on this node, or a usage error before NCCL's duplicate-GPU one.

        `bound`: CUDA_VISIBLE_DEVICES is set for this task (--gpus-per-task, --gpu-bind): each
        task sees GPUs of its own, and local_rank modulo what it sees picks one of them.
        Otherwise the node's tasks share what they see, and need at least one GPU each."""
        tasks = self.local_world_size
        if visible <= 0 or tasks <= 1 or visible >= tasks or bound:
            return
        raise DistEnvError(
            f"{tasks} ranks on this node share {visible} visible GPU(s), so two ranks would "
            "drive one GPU; ask for one GPU per rank (cluster.gpus_per_node >= ranks per node, "
            "or gpu_request: gpus-per-task) or start fewer ranks per node")

    def torch_env(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads (and torchrun would set)."""
        if not self.master_addr:
            raise DistEnvError(
                f"no master address for torch's rendezvous ({self.master_addr_source}); "
                "export MASTER_ADDR=<host of rank 0>"
            )
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
        }
        if self.network_interface:
            env["NCCL_SOCKET_IFNAME"] = self.network_interface
        gloo = self.gloo_interface()
        if gloo:
            env["GLOO_SOCKET_IFNAME"] = gloo
        return env

    def gloo_interface(self, available: list[str] | None = None) -> str | None:
        """The interface Gloo (torch's and Horovod's) uses on this node; None: Gloo picks.

        GLOO_SOCKET_IFNAME from the environment if set; else network_interface, which is in
        NCCL's syntax: plain names pass as they are (without NCCL's '=' exact-match mark), and
        an exclusion list `^a,b`, which Gloo cannot read, becomes the first interface of this
        node that has an IPv4 address and that no entry prefixes (NCCL matches prefixes).
        """
        if self.gloo_socket_ifname:
            return self.gloo_socket_ifname
        if not self.network_interface:
            return None
        plain = plain_interfaces(self.network_interface)
        if plain:
            return plain
        excluded = [p for p in self.network_interface[1:].split(",") if p]
        names = local_interfaces() if available is None else available
        for name in names:
            if not any(name.startswith(prefix) for prefix in excluded):
                return name
        raise DistEnvError(
            f"network interface {self.network_interface!r} leaves Gloo no interface with an "
            f"IPv4 address on {socket.gethostname()} (it has: {', '.join(names) or 'none'}); "
            "name one in cluster.network_interface, e.g. ib0 or eth0")

    def horovod_view(self) -> dict[str, int]:
        """rank, size, local_rank, local_size, cross_rank, cross_size in Horovod's terms.

        Horovod's cross communicator joins the processes with the same local rank, one per
        node: with uneven nodes (`3,2`) local rank 2 exists on one node only.
        """
        for slot in horovod_slots(self.layout()):
            if (slot["node_rank"], slot["local_rank"]) == (self.node_rank, self.local_rank):
                return {"rank": self.rank, "size": self.world_size,
                        "local_rank": self.local_rank, "local_size": self.local_world_size,
                        "cross_rank": slot["cross_rank"], "cross_size": slot["cross_size"]}
        return {"rank": self.rank, "size": self.world_size, "local_rank": self.local_rank,
                "local_size": self.local_world_size, "cross_rank": self.node_rank,
                "cross_size": self.num_nodes}

    def layout(self) -> list[int]:
        """Tasks on each node, by node rank (uniform when Slurm did not say)."""
        return list(self.tasks_per_node) or [self.local_world_size] * self.num_nodes

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (tuples become lists)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    def describe(self) -> str:
        """Human text, one `key: value` per line."""
        lines = []
        for key, value in self.as_dict().items():
            if key == "hosts":
                value = _short_list(value)
            elif isinstance(value, list):
                value = ",".join(map(str, value)) or "-"
            elif value is None:
                value = "-"
            lines.append(f"{key}: {value}")
        return "\n".join(lines)


def _short_list(hosts: list[str], keep: int = 8) -> str:
    if not hosts:
        return "-"
    if len(hosts) <= keep:
        return ",".join(hosts)
    return ",".join(hosts[:keep]) + f",... ({len(hosts)} hosts)"


def horovod_slots(layout: list[int]) -> list[dict[str, int]]:
    """Every rank's place in Horovod's terms, for tasks per node `layout` (e.g. [2, 2]), in
    rank order: rank, node_rank, local_rank, local_size, cross_rank, cross_size. Horovod's
    cross communicator joins the ranks with the same local rank, one per node, so with uneven
    nodes (3,2) local rank 2 exists on one node only. The one source for `hpcdp env` and for
    the Gloo rendezvous train/ serves."""
    slots, rank = [], 0
    for node, count in enumerate(layout):
        for local_rank in range(count):
            holders = [n for n, c in enumerate(layout) if c > local_rank]
            slots.append({"rank": rank, "node_rank": node, "local_rank": local_rank,
                          "local_size": count, "cross_rank": holders.index(node),
                          "cross_size": len(holders)})
            rank += 1
    return slots


def plain_interfaces(nccl_ifname: str) -> str | None:
    """NCCL-syntax interfaces as Gloo reads them: `ib0`, `=eth0` -> `eth0`; None for an
    exclusion list (`^lo,docker0`), which only the node itself can resolve."""
    if nccl_ifname.startswith("^"):
        return None
    return nccl_ifname.lstrip("=") or None


def network_env(interface: str | None) -> dict[str, str]:
    """What a rendered script exports for the profile's network_interface: hpcdp's own
    variable, NCCL's, and Gloo's where it can be written down before the job runs (an
    exclusion list is resolved on each node by DistEnv.gloo_interface)."""
    if not interface:
        return {}
    env = {"HPCDP_NETWORK_INTERFACE": interface, "NCCL_SOCKET_IFNAME": interface}
    plain = plain_interfaces(interface)
    if plain:
        env["GLOO_SOCKET_IFNAME"] = plain
    return env


def local_interfaces() -> list[str]:
    """This node's network interfaces that have an IPv4 address, in the kernel's order."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: fails for an interface without an IPv4 address (or down)
                fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            found.append(name)
    return found


# --------------------------------------------------------------------------------------------
# Reading variables


def _int(environ: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    """The variable as an int, None when unset or empty; DistEnvError naming it when malformed."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise DistEnvError(f"{name}={one_line(raw)!r} is not a whole number") from None
    if value < minimum:
        raise DistEnvError(f"{name}={raw.strip()} must be >= {minimum}")
    return value


_TASKS_RE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def parse_tasks_per_node(text: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's compressed per-node counts: `2(x3)` -> [2, 2, 2]; `2(x2),1` -> [2, 2, 1]."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _TASKS_RE.fullmatch(part.strip())
        if not match:
            raise DistEnvError(
                f"{name}={one_line(text)!r} is malformed; expected counts like 4, 2(x3) or 3,1"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _hosts_from(environ: Mapping[str, str], name: str) -> list[str]:
    try:
        return expand_hostlist(environ[name])
    except HostlistError as exc:
        raise HostlistError(f"{name}: {exc}") from None


def _job_id(environ: Mapping[str, str]) -> str | None:
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None


class _SlurmJob:
    """What every process of a Slurm job can read, whichever launcher started it."""

    def __init__(self, environ: Mapping[str, str], step_nodes: bool) -> None:
        self.job_id = _job_id(environ)
        self.restart_count = _int(environ, "SLURM_RESTART_COUNT") or 0
        self.cpus_per_task = _int(environ, "SLURM_CPUS_PER_TASK", minimum=1)
        self.num_tasks = (_int(environ, "SLURM_NTASKS", minimum=1)
                          or _int(environ, "SLURM_NPROCS", minimum=1))
        # An srun task belongs to its step, whose nodes may be fewer than the job's. Processes
        # that torchrun or horovodrun started take the job's nodes.
        names = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
        if step_nodes:
            names = ("SLURM_STEP_NODELIST",) + names
        self.hosts: list[str] = []
        self.hosts_from = ""
        for name in names:
            if environ.get(name, "").strip():
                self.hosts = _hosts_from(environ, name)
                self.hosts_from = name
                break

    @property
    def present(self) -> bool:
        return self.job_id is not None


# Step ids Slurm reserves for the batch shell, the extern step and interactive steps
# (SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, SLURM_INTERACTIVE_STEP in slurm.h).
_SPECIAL_STEP_IDS = {4294967291, 4294967292, 4294967290}


def _in_slurm_step(environ: Mapping[str, str]) -> bool:
    """True in a task started by srun; False in a batch or salloc shell.

    Checked on Slurm 22.05: sbatch's shell has SLURM_PROCID=0, SLURM_LOCALID=0 and
    SLURM_NODEID=0 too, so SLURM_PROCID alone does not mean srun. srun sets SLURM_STEP_ID (and
    the older SLURM_STEPID) in every task; the shells have neither. An environment with
    SLURM_PROCID but no step id that is not marked ENVIRONMENT=BATCH (hand-made, or from a
    tool that copies only the rank variables) counts as a step.
    """
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if step is not None:
        return step.strip() not in {str(i) for i in _SPECIAL_STEP_IDS} | {"batch", "extern"}
    return "SLURM_PROCID" in environ and environ.get("ENVIRONMENT") != "BATCH"


def _slurm_layout(environ: Mapping[str, str], node_rank: int, world: int,
                  num_nodes: int) -> tuple[list[int], str]:
    """Tasks on each node of an srun step, and the variable they came from."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if environ.get(name, "").strip():
            layout = parse_tasks_per_node(environ[name], name)
            break
    else:
        name = "SLURM_NTASKS_PER_NODE"
        layout = [_int(environ, name, 1) or -(-world // num_nodes)] * num_nodes
    if node_rank >= len(layout):
        raise DistEnvError(
            f"SLURM_NODEID={node_rank} has no entry in "
            f"{name}={environ.get(name, ','.join(map(str, layout)))!r}")
    return layout, f"tasks on this node ({name})"


def _master(environ: Mapping[str, str], slurm: _SlurmJob, launcher: LauncherVars | None,
            num_nodes: int) -> tuple[str, str]:
    """Rank 0's host for torch's rendezvous, and where it came from."""
    if environ.get("MASTER_ADDR", "").strip():
        by = "set by torchrun" if launcher and launcher.sets_master else "set in the environment"
        return environ["MASTER_ADDR"].strip(), f"MASTER_ADDR ({by})"
    if slurm.hosts:
        return slurm.hosts[0], f"first host of {slurm.hosts_from}"
    if num_nodes == 1:
        return "127.0.0.1", "single node"
    fallback = launcher.master_fallback if launcher else ""
    if fallback and environ.get(fallback, "").strip():
        return environ[fallback].strip(), f"{fallback} ({launcher.name}'s host)"
    return "", "no launcher variable names rank 0's host"


def _port(environ: Mapping[str, str], slurm: _SlurmJob) -> tuple[int, str]:
    port = _int(environ, "MASTER_PORT", minimum=1)
    if port is not None:
        if port > 65535:
            raise DistEnvError(f"MASTER_PORT={port} is not a TCP port (1-65535)")
        return port, "MASTER_PORT (set in the environment)"
    if slurm.job_id is not None:
        return master_port_for_job(slurm.job_id), f"derived from SLURM_JOB_ID={slurm.job_id}"
    return DEFAULT_MASTER_PORT, "default (no job id)"


def _interface(environ: Mapping[str, str]) -> str | None:
    for name in ("HPCDP_NETWORK_INTERFACE", "NCCL_SOCKET_IFNAME"):
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def _check_ranges(env: DistEnv, names: dict[str, str]) -> DistEnv:
    """Ranks inside their sizes; names maps field -> the variable it came from."""
    pairs = (("rank", "world_size"), ("local_rank", "local_world_size"),
             ("node_rank", "num_nodes"))
    for index, size in pairs:
        i, n = getattr(env, index), getattr(env, size)
        if n < 1 or not 0 <= i < n:
            raise DistEnvError(
                f"{names.get(index, index)}={i} is outside {names.get(size, size)}={n} "
                f"(launcher {env.launcher})"
            )
    return env


# --------------------------------------------------------------------------------------------
# The launchers: where each one puts each value


@dataclass(frozen=True)
class LauncherVars:
    """Where one launcher writes each value; the first of several names that is set wins.

    Sizes absent from a launcher's variables are derived by the one builder: local world
    size from the layout (or the world), node rank as rank // local world size, nodes as
    world / local world size rounded up.
    """

    name: Launcher
    rank: tuple[str, ...]
    world_size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_world_size: tuple[str, ...]
    node_rank: tuple[str, ...]
    num_nodes: tuple[str, ...]
    restarts: tuple[str, ...] = ()
    """Its restart counter, read only outside Slurm (SLURM_RESTART_COUNT wins inside)."""
    sets_master: bool = False
    """MASTER_ADDR is the launcher's own (torchrun), not a user's export."""
    master_fallback: str = ""
    """A variable naming rank 0's host when neither MASTER_ADDR nor Slurm does."""
    required: tuple[str, ...] = ("rank", "world_size", "local_rank")


LAUNCHERS: dict[Launcher, LauncherVars] = {
    "torchrun": LauncherVars(
        "torchrun", rank=("RANK",), world_size=("WORLD_SIZE",), local_rank=("LOCAL_RANK",),
        local_world_size=("LOCAL_WORLD_SIZE",), node_rank=("GROUP_RANK", "NODE_RANK"),
        num_nodes=("GROUP_WORLD_SIZE",), restarts=("TORCHELASTIC_RESTART_COUNT",),
        sets_master=True),
    # horovod/runner/gloo_run.py create_slot_env_vars. The cross rank is the node's index
    # among the nodes holding this local rank: the node rank when every node runs as many.
    "horovodrun": LauncherVars(
        "horovodrun", rank=("HOROVOD_RANK",), world_size=("HOROVOD_SIZE",),
        local_rank=("HOROVOD_LOCAL_RANK",), local_world_size=("HOROVOD_LOCAL_SIZE",),
        node_rank=("HOROVOD_CROSS_RANK",), num_nodes=("HOROVOD_CROSS_SIZE",),
        master_fallback="HOROVOD_GLOO_RENDEZVOUS_ADDR"),
    # srun's task variables; the SLURM_STEP_* names are the step's own counts, which may be
    # fewer than the job's. This node's task count comes from the layout (see _slurm_layout).
    "slurm": LauncherVars(
        "slurm", rank=("SLURM_PROCID",),
        world_size=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        local_rank=("SLURM_LOCALID",), local_world_size=(), node_rank=("SLURM_NODEID",),
        num_nodes=("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        required=("rank", "world_size", "local_rank", "node_rank")),
}


def _which_launcher(environ: Mapping[str, str]) -> LauncherVars | None:
    """The launcher that started this process, first match wins (see the module docstring)."""
    if "TORCHELASTIC_RUN_ID" in environ or all(
        environ.get(k, "").strip() for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")
    ):
        return LAUNCHERS["torchrun"]
    if "HOROVOD_RANK" in environ:
        return LAUNCHERS["horovodrun"]
    if _job_id(environ) and _in_slurm_step(environ):
        return LAUNCHERS["slurm"]
    return None


def detect(environ: Mapping[str, str] | None = None) -> DistEnv:
    """The distributed environment of this process, read from `environ` (default os.environ)."""
    environ = os.environ if environ is None else environ
    launcher = _which_launcher(environ)
    slurm = _SlurmJob(environ, step_nodes=launcher is LAUNCHERS["slurm"])
    common: dict[str, Any] = dict(
        hosts=tuple(slurm.hosts), job_id=slurm.job_id, cpus_per_task=slurm.cpus_per_task,
        network_interface=_interface(environ), job_num_tasks=slurm.num_tasks,
        gloo_socket_ifname=environ.get("GLOO_SOCKET_IFNAME", "").strip() or None,
    )
    if launcher is None:
        return _world_of_one(environ, slurm, common)
    return _from_launcher(launcher, environ, slurm, common)


def _from_launcher(row: LauncherVars, environ: Mapping[str, str], slurm: _SlurmJob,
                   common: dict[str, Any]) -> DistEnv:
    """The one builder: read a launcher's variables, derive what it leaves out, check ranges."""
    came_from: dict[str, str] = {}  # field -> the variable it was read from, for errors

    def read(field: str, minimum: int = 0) -> int | None:
        for name in getattr(row, field):
            value = _int(environ, name, minimum)
            if value is not None:
                came_from[field] = name
                return value
        if field in row.required:
            raise DistEnvError(f"{row.name} environment without {' or '.join(getattr(row, field))}")
        return None

    rank, world, local_rank = read("rank"), read("world_size", 1), read("local_rank")
    node_rank, num_nodes = read("node_rank"), read("num_nodes", 1)
    assert rank is not None and world is not None and local_rank is not None  # required
    layout: list[int] = []
    if row.name == "slurm":
        assert node_rank is not None  # required
        num_nodes = num_nodes or len(slurm.hosts) or 1
        layout, came_from["local_world_size"] = _slurm_layout(environ, node_rank, world,
                                                              num_nodes)
        local_world = layout[node_rank]
        gtids = environ.get("SLURM_GTIDS", "").strip()
        if gtids:  # this node's task ids, which no layout indexing can get wrong
            if not re.fullmatch(r"\d+(,\d+)*", gtids):
                raise DistEnvError(f"SLURM_GTIDS={one_line(gtids)!r} is not a list of task ids")
            local_world = len(gtids.split(","))
            came_from["local_world_size"] = "tasks on this node (SLURM_GTIDS)"
    else:
        local_world = read("local_world_size", 1) or world
    node_rank = rank // local_world if node_rank is None else node_rank
    num_nodes = num_nodes or -(-world // local_world)
    addr, addr_source = _master(environ, slurm, row, num_nodes)
    port, port_source = _port(environ, slurm)
    restarts = slurm.restart_count if slurm.present else read("restarts") or 0
    env = DistEnv(
        launcher=row.name, rank=rank, local_rank=local_rank, world_size=world,
        local_world_size=local_world, node_rank=node_rank, num_nodes=num_nodes,
        master_addr=addr, master_port=port, master_addr_source=addr_source,
        master_port_source=port_source, tasks_per_node=tuple(layout),
        restart_count=restarts, **common,
    )
    return _check_ranges(env, came_from)


def _world_of_one(environ: Mapping[str, str], slurm: _SlurmJob, common: dict[str, Any]) -> DistEnv:
    """No launcher: a plain process, or a Slurm batch shell that srun did not start (its
    `in_step=False` lets check_world say "run it with srun")."""
    addr, addr_source = _master(environ, slurm, None, 1)
    port, port_source = _port(environ, slurm)
    return DistEnv(
        launcher="slurm" if slurm.present else "none", rank=0, local_rank=0, world_size=1,
        local_world_size=1, node_rank=0, num_nodes=1, master_addr=addr, master_port=port,
        master_addr_source=addr_source, master_port_source=port_source, in_step=False,
        tasks_per_node=(1,), restart_count=slurm.restart_count, **common,
    )


# --------------------------------------------------------------------------------------------
# Checks that fail fast instead of hanging


def _short(name: str) -> str:
    return name.strip().lower().split(".")[0]


def _addresses(name: str) -> set[str]:
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None)}
    except (socket.gaierror, UnicodeError, OSError):
        return set()


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_master_is_rank0_node(env: DistEnv, hostname: str) -> None:
    """On rank 0: fail fast when master_addr is not this host (the rendezvous would hang).

    Equal short names pass; so does a master address that resolves to one of this host's
    addresses, or to a loopback address in a single-node job. `localhost` in a multi-node job
    fails (pain point 2). Other ranks return at once.
    """
    if env.rank != 0 or (env.world_size == 1 and not env.master_addr):
        return
    master = env.master_addr
    if not master:
        raise DistEnvError(f"rank 0 on {hostname!r} has no master address to listen on")
    if _short(master) == _short(hostname):
        return
    master_addrs = _addresses(master)
    # "localhost" is a different machine on every node, even where this host's name maps to
    # 127.0.0.1 too. (Other 127.x addresses can name real nodes, as on the local test cluster
    # where node2 is 127.0.100.2: those are compared like any address.)
    if env.num_nodes > 1 and (_short(master) == "localhost" or master_addrs & {"127.0.0.1", "::1"}):
        raise DistEnvError(
            f"MASTER_ADDR {master!r} is a loopback address but the job spans {env.num_nodes} "
            f"nodes; other nodes cannot reach rank 0 on {hostname!r} there "
            f"(master from {env.master_addr_source})"
        )
    if master_addrs & (_addresses(hostname) | {hostname}):
        return
    if env.num_nodes == 1 and master_addrs and all(_is_loopback(a) for a in master_addrs):
        return  # on one node every loopback address reaches this machine
    raise DistEnvError(
        f"rank 0 runs on {hostname!r} but MASTER_ADDR is {master!r} "
        f"(from {env.master_addr_source}); the rendezvous would hang. "
        "Unset MASTER_ADDR to use the job's first node, or start rank 0 there"
    )


def check_world(env: DistEnv, expected_world_size: int | None,
                expected_tasks_per_node: int | None) -> None:
    """Fail fast when the processes started are not the ones the job asked for."""
    asked = expected_world_size
    if asked is None and not env.in_step and env.job_num_tasks and env.job_num_tasks > 1:
        asked = env.job_num_tasks
    if asked is not None and env.world_size != asked:
        plural = "process" if env.world_size == 1 else "processes"
        if env.launcher == "none":
            fix = f"start {asked} processes with srun, torchrun or horovodrun"
        elif not env.in_step:
            fix = "run it with srun inside the allocation (the rendered script does)"
        elif env.launcher == "slurm":
            fix = f"start it with srun --ntasks={asked} (the rendered script does)"
        else:
            fix = f"start {asked} processes with {env.launcher}"
        raise DistEnvError(
            f"started with {env.world_size} {plural} but the job asked for {asked}; {fix}"
        )
    if expected_tasks_per_node is not None and env.local_world_size != expected_tasks_per_node:
        layout = ",".join(map(str, env.tasks_per_node)) or str(env.local_world_size)
        raise DistEnvError(
            f"node {env.node_rank} runs {env.local_world_size} tasks but the job asked for "
            f"{expected_tasks_per_node} per node (tasks per node: {layout}); start it with "
            f"srun --ntasks-per-node={expected_tasks_per_node} (srun -n alone may fill nodes "
            "unevenly)"
        )


def threads_per_process(env: DistEnv, environ: Mapping[str, str] | None = None) -> int:
    """CPU threads each process should use, the one rule (train/ applies it, `hpcdp env` shows
    it): an explicit OMP_NUM_THREADS (torchrun sets 1, a user may set more), else
    SLURM_CPUS_PER_TASK, else this node's CPUs shared among its processes; at least 1."""
    raw = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    if env.cpus_per_task:
        return max(1, env.cpus_per_task)
    return max(1, (os.cpu_count() or 1) // max(1, env.local_world_size))
