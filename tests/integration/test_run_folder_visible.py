"""A run folder the nodes cannot see (issue 36, item 6). `hpcdp submit` runs in a private mount
namespace (`unshare -m`, root only) with a tmpfs over an empty folder: the submitting shell sees
what hpcdp writes there, the cluster's slurmd and its jobs see the empty folder below, as a
compute node sees a login node's /tmp. Before, `--wait` ended "FAILED; see DIR/slurm-N.out"
and that file existed nowhere the user could look.

The check before submitting cannot tell here (the local cluster's nodes are this machine, and
it is right for them to see its /tmp): tests/unit/test_shared_fs.py tries it with nodes that
are other machines. What the test shows is the job's own check on the node and what `--wait`,
`status` and a script submitted by hand with plain sbatch then say."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import sets, wait_all

pytestmark = pytest.mark.slurm


def in_private_mount(folder: Path, command: list[str], env: dict) -> subprocess.CompletedProcess:
    """`command` with a tmpfs mounted over `folder` that only it sees."""
    script = (f"mount -t tmpfs -o size=64m tmpfs {shlex.quote(str(folder))} && "
              + " ".join(map(shlex.quote, command)))
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_run_folder_only_the_submitting_shell_sees_is_named(slurm_cluster, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private mount namespace")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    env = {**os.environ, "HPCDP_STATE_DIR": str(tmp_path / "state")}
    submit = [sys.executable, "-m", "hpcdp", "submit", "--strategy", "single-gpu", "--out",
              str(hidden / "runs"), *sets("train.steps=5", "data.corpus=synthetic")]
    done = in_private_mount(hidden, [*submit, "--wait", "--timeout", "120"], env)
    if "mount: " in done.stderr and "permission denied" in done.stderr.lower():
        pytest.skip(f"no private mounts here: {done.stderr.strip()}")
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"job \d+: FAILED \(exit 66\)", done.stdout), done.stdout
    assert re.search(r"ended FAILED: no log at \S+slurm-\d+\.out; the node\(s\) may not see the "
                     r"run folder .*give --out a folder on a filesystem the nodes share",
                     done.stderr), done.stderr
    assert not any(hidden.iterdir())  # outside the namespace: nothing was written there

    status = subprocess.run([sys.executable, "-m", "hpcdp", "status", "--json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, env=env)
    row = json.loads(status.stdout)[-1]
    assert row["state"] == "FAILED" and row["exit_code"] == 66, row
    assert row["why"].startswith("the node(s) could not see the run folder"), row

    # the same script by hand, rendered and sbatch'ed from a shell that sees the folder
    render = [sys.executable, "-m", "hpcdp", "render", "--strategy", "single-gpu", "--out",
              str(hidden / "runs"), *sets("train.steps=5", "data.corpus=synthetic")]
    script = hidden / "runs" / "smoke" / "single-gpu-1n" / "job.sbatch"
    by_hand = in_private_mount(hidden, ["sh", "-c", f"{shlex.join(render)} >/dev/null && "
                                        f"sbatch --parsable {shlex.quote(str(script))}"], env)
    assert by_hand.returncode == 0, by_hand.stdout + by_hand.stderr
    job_id = by_hand.stdout.strip().splitlines()[-1]
    info = wait_all([job_id], timeout_s=120)[job_id]
    assert (info.state, info.exit_code) == ("FAILED", 66), info
