"""The local Slurm cluster (`hpcdp cluster up|down|status`): a thin layer over its script.

scripts/local-slurm.sh does the work (munge, MariaDB, slurmdbd, slurmctld, four slurmd nodes);
this module runs it, streams its output, and answers cheap questions ("is it up?", "which
SLURM_CONF?") without starting anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local-slurm.sh"
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


def up() -> int:
    """Start the cluster (a no-op when it is up); 0 when up, 3 when it cannot start here."""
    return run_script("up").returncode


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
