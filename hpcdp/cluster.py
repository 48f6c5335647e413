"""The local Slurm cluster (`hpcdp cluster up|down|status|link`): a thin layer over its script.

scripts/local-slurm.sh does the work (munge, MariaDB, slurmdbd, slurmctld, six slurmd nodes,
each in a network namespace of its own on a shaped link and on its own core); this module runs
it, streams its output, and answers cheap questions ("is it up?", "which SLURM_CONF?", "do the
nodes have their own network?") without starting anything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpcdp import SCRIPTS_DIR
from hpcdp.errors import UsageError

SCRIPT = SCRIPTS_DIR / "local-slurm.sh"
DEFAULT_CLUSTER_DIR = "/tmp/hpcdp-slurm"

# The script's exit code when the cluster cannot start here (not root, a command missing).
CANNOT_START = 3


@dataclass(frozen=True)
class ScriptResult:
    """What one run of the script did: its exit code and everything it printed."""

    returncode: int
    output: str

    @property
    def last_line(self) -> str:
        """The script's last non-empty line: its reason, when it failed."""
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def cluster_dir() -> Path:
    """Where the cluster keeps everything (HPCDP_CLUSTER_DIR, as the script reads it)."""
    return Path(os.environ.get("HPCDP_CLUSTER_DIR") or DEFAULT_CLUSTER_DIR)


def slurm_conf_path() -> Path:
    """The local cluster's slurm.conf (exists once the cluster has been started)."""
    return cluster_dir() / "etc" / "slurm.conf"


def run_script(*args: str) -> ScriptResult:
    """Run scripts/local-slurm.sh ARGS, echoing its output line by line as it comes.

    Output is both streamed (so `hpcdp cluster up` shows progress) and kept (so a caller can
    report the script's reason). The daemons it starts send their output to their own logs,
    so the pipe closes when the script ends.
    """
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return ScriptResult(proc.wait(), "".join(lines))


# A link's rate as tc takes it (1gbit, 250mbit, 1.5gbit, 800kbit), or none (unshaped) or default.
RATE = re.compile(r"(\d+(\.\d+)?)(kbit|mbit|gbit)")
RATE_HINT = "a rate such as 1gbit, 250mbit or 800kbit, none (unshaped) or default"


def check_rate(rate: str) -> str:
    """`rate` when the script takes it; else UsageError naming it (before anything runs)."""
    match = RATE.fullmatch(rate)
    scale = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    if rate in ("none", "default") or (match and float(match[1]) * scale[match[3]] >= 8e3):
        return rate
    raise UsageError(f"link rate {rate!r} is not valid: give {RATE_HINT}")


def up(link: str | None = None) -> int:
    """Start the cluster (a no-op when it is up; `link` then sets every node's link rate);
    0 when up, 3 when it cannot start here."""
    return run_script("up", *(["--link", check_rate(link)] if link else [])).returncode


def set_link_rate(rate: str, nodes: list[str]) -> int:
    """Shape the links of `nodes` (all nodes when empty) to `rate` on the running cluster."""
    return run_script("link", "rate", check_rate(rate), *nodes).returncode


def set_link_state(node: str, state: str) -> int:
    """Cut (`down`) or restore (`up`) one node's link on the running cluster."""
    if state not in ("down", "up"):
        raise UsageError(f"link state {state!r} is not valid: give down or up "
                         "(hpcdp cluster link NODE down|up)")
    return run_script("link", node, state).returncode


def _network_record(key: str) -> str:
    """One line of what `up` recorded of the node network (etc/network), "" when none."""
    try:
        text = (cluster_dir() / "etc" / "network").read_text()
    except OSError:
        return ""
    found = re.search(rf"^{key}=(\S+)$", text, re.MULTILINE)
    return found[1] if found else ""


def network_mode() -> str:
    """"namespaces" when the cluster's nodes each have their own network, "loopback" when they
    share this machine's (no namespaces here), "" before any `up`."""
    return _network_record("mode")


def node_interface() -> str:
    """The interface a job on the cluster's nodes uses: hsn0, or lo where they share the
    machine's loopback (also before any `up`)."""
    return _network_record("interface") or "lo"


def node_subnet() -> str:
    """The nodes' subnet (198.18.0.0/24) in namespace mode, else "": addresses of nodes that
    run on this machine and see its file systems, though they have a network of their own."""
    return _network_record("subnet") if network_mode() == "namespaces" else ""


def down(purge: bool = False) -> int:
    """Stop every daemon of the cluster; purge=True also deletes its directory."""
    return run_script("down", *(["--purge"] if purge else [])).returncode


def status() -> int:
    """Print which daemons run and sinfo; 0 when everything runs."""
    return run_script("status").returncode


def _live_pid(pid_file: Path, name: str) -> int | None:
    """The pid in `pid_file` when it is a live process called `name`, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
        # The name check keeps a stale pid file from matching some reused pid; a zombie (state
        # Z, a daemon that died and is not reaped yet) is dead.
        stat = Path(f"/proc/{pid}/stat").read_text()
        alive = f"({name})" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive else None


def _pid_alive(pid_file: Path, name: str) -> bool:
    return _live_pid(pid_file, name) is not None


def daemon_pids() -> dict[str, int]:
    """The cluster's live daemons, by pid file: {"slurmctld": 41, "slurmd-node1": 57, ...}.

    A daemon that died is missing, so comparing two calls tells whether one died (or was
    restarted) in between.
    """
    live = {}
    for pid_file in sorted((cluster_dir() / "run").glob("*.pid")):
        # mysqld.pid is MariaDB's; the others are named after their daemon (slurmd-node1).
        name = "mariadbd" if pid_file.stem == "mysqld" else pid_file.stem.split("-")[0]
        pid = _live_pid(pid_file, name)
        if pid is not None:
            live[pid_file.stem] = pid
    return live


def is_up() -> bool:
    """Cheap check, starts nothing: conf exists, slurmctld runs, and sinfo answers."""
    conf = slurm_conf_path()
    if not conf.is_file() or not _pid_alive(cluster_dir() / "run" / "slurmctld.pid", "slurmctld"):
        return False
    try:
        result = subprocess.run(
            ["sinfo", "-h", "-o", "%P"],
            env={**os.environ, "SLURM_CONF": str(conf)},
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def slurm_env() -> dict[str, str]:
    """{"SLURM_CONF": ...} for the local cluster once its conf exists, else {}."""
    conf = slurm_conf_path()
    return {"SLURM_CONF": str(conf)} if conf.is_file() else {}
