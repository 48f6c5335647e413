"""Whether a partition's nodes can see a run folder. A job writes its log, metrics and
checkpoints into the run folder, from the nodes: a folder on this machine's own disk or memory
(/tmp, a tmpfs) exists for the submitting shell only, and the job's output then lands on the
node's own /tmp, where `submit --wait` and harvest never find it.

What can be told before submitting is told here (`problem`); the job script checks again on
the node (its experiment file must be there, or it ends with NOT_VISIBLE_EXIT), and `status`
and `--wait` name a missing log as the likely sign of the same thing."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

NOT_VISIBLE_EXIT = 66
"""The job script's exit code when its node cannot see the run folder (sysexits' EX_NOINPUT)."""

WAY_OUT = ("(a folder on this machine's own disk, such as /tmp?): give --out a folder on a "
           "filesystem the nodes share")
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}
NODE_LOCAL_PATHS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
"""Folders every machine has its own of, whatever the filesystem below them."""


def filesystem_of(path: Path, mounts: str | None = None) -> tuple[str, str]:
    """(mount point, filesystem type) holding `path`, from /proc/mounts (`mounts`: its text)."""
    path = _resolved(path)
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "/", "unknown"
    best = ("/", "unknown")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == Path(point) or Path(point) in path.parents
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def _resolved(path: Path) -> Path:
    """`path` with the links of its existing part resolved (a folder not made yet keeps its
    name below them)."""
    path = Path(path).expanduser().absolute()
    existing, tail = path, []
    while not existing.exists() and existing != existing.parent:
        existing, tail = existing.parent, [existing.name, *tail]
    return existing.resolve().joinpath(*tail)


def is_this_machine(address: str, local_subnet: str | None = None) -> bool:
    """Whether a node's address is this machine: a loopback address, one of the local
    cluster's nodes (each in a network namespace of this machine: `local_subnet`, by default
    what `hpcdp cluster up` recorded), or this host's name or address."""
    if local_subnet is None:
        from hpcdp import cluster

        local_subnet = cluster.node_subnet()
    try:
        ip = ipaddress.ip_address(address)
        if ip.is_loopback or (local_subnet and ip in ipaddress.ip_network(local_subnet)):
            return True
    except ValueError:
        pass
    host = socket.gethostname()
    return address in ("localhost", host, host.split(".")[0], socket.getfqdn())


def problem(run_dir: Path, node_addresses: list[str] | None,
            mounts: str | None = None) -> str | None:
    """Why the partition's nodes cannot see `run_dir`, or None when they can or it cannot be
    told (Slurm did not say which nodes; every node is this machine)."""
    if node_addresses:
        from hpcdp import cluster

        subnet = cluster.node_subnet()  # read once, not once per node
    if not node_addresses or all(is_this_machine(a, subnet) for a in node_addresses):
        return None
    point, kind = filesystem_of(run_dir, mounts)
    resolved = _resolved(run_dir)
    local = next((p for p in NODE_LOCAL_PATHS if resolved == Path(p)
                  or Path(p) in resolved.parents), None)
    if kind in MEMORY_FILESYSTEMS:
        why = f"on a {kind} mounted at {point}, in this machine's memory"
    elif local:
        why = f"under {local}, which every machine has its own of"
    else:
        return None
    return (f"run folder {str(run_dir)!r} is {why}: the partition's nodes "
            f"({', '.join(node_addresses[:3])}{', ...' if len(node_addresses) > 3 else ''}) "
            "cannot see it, and the job's log and metrics would land on theirs; give --out a "
            "folder on a filesystem they share (home, project or scratch)")
