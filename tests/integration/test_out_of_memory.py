"""Out of memory, named (issue 36, item 3): a DDP job whose ranks outgrow their memory ends
with "out of memory (rank R on NODE)" and what to try, in the job log, in `submit --wait`, in
`hpcdp status` and in harvest's note, where srun says only "task R: Killed".

Both ways a rank dies of memory, on the local cluster:
- Slurm enforces the job's --mem (cluster.mem). The local cluster tracks memory and kills a
  step over it with jobacct_gather's OverMemoryKill (it has no cgroups): a real limit, and a
  rank that really grows past it after step 3 (HPCDP_FAULT=hog@3:1 takes memory until killed,
  as a leak would).
- Nothing enforces it and the kernel's OOM killer sends SIGKILL. Filling this machine's memory
  would take the cluster's daemons with it, so here the rank sends itself the same SIGKILL
  (HPCDP_FAULT=kill@3:1, train/faults.py): what srun, the job script, status and harvest then
  read is what they would read after the kernel's kill.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import sets

pytestmark = pytest.mark.slurm

SETTINGS = sets("train.steps=20", "train.eval_interval=0", "train.checkpoint_interval=0",
                "data.corpus=synthetic")


def hpcdp(*args: str, cwd: Path, env: dict[str, str], timeout: int = 300):
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})


@pytest.mark.parametrize("how,extra,fault,says", [
    ("slurm-limit", sets("cluster.mem=1G"), "hog@3:1",
     r"out of memory \(rank 1 on node\d+\): the step used \d+\.\d GiB, over the job's memory "
     r"limit of 1\.0 GiB \(--mem\), and Slurm killed it"),
    ("sigkill", [], "kill@3:1",
     r"killed by SIGKILL \(rank 1 on node\d+\): out of memory is the likely cause: nothing "
     r"else in the log explains the SIGKILL"),
])
def test_a_rank_out_of_memory_is_named_everywhere(slurm_cluster, tmp_path, how, extra, fault,
                                                   says):
    env = {"HPCDP_STATE_DIR": str(tmp_path / "state"), "HPCDP_FAULT": fault}
    done = hpcdp("submit", "--strategy", "distributed-ps", "--nodes", "2", "--out",
                 str(tmp_path / "runs"), *SETTINGS, *extra, "--wait", "--timeout", "240",
                 cwd=tmp_path, env=env)
    run_dir = Path(re.search(r"run:\s+(\S.*)", done.stdout).group(1).strip())
    log = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert done.returncode == 1, done.stdout + done.stderr + log[-3000:]
    assert re.search(rf"ended FAILED: {says}", done.stderr), done.stderr + log[-3000:]
    assert "try fewer ranks per node, a sharded strategy (fsdp, zero1)" in done.stderr

    # the job log: once, and no relaunch (a start-up death is relaunched; memory would again)
    assert len(re.findall(rf"^hpcdp: {says}", log, re.M)) == 1, log[-3000:]
    assert "relaunching" not in log
    assert "Traceback" not in log, log[-3000:]  # the peer that lost rank 1: one line

    status = hpcdp("status", "--json", cwd=tmp_path, env=env)
    assert status.returncode == 0 and status.stdout.startswith("["), status.stdout + status.stderr
    rows = json.loads(status.stdout)
    assert re.match(says, rows[-1]["why"]), rows[-1]
    assert re.search(says, hpcdp("status", cwd=tmp_path, env=env).stdout)

    harvest = hpcdp("harvest", str(run_dir), "--format", "json", "--no-plots", cwd=tmp_path,
                    env=env)
    notes = json.loads(harvest.stdout)["runs"][0]["notes"]
    assert any(re.search(says, note) for note in notes), notes
    assert not any(note.startswith("failed with exit code") for note in notes), notes
