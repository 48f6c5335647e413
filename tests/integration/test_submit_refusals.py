"""What a new user hit off the happy path on the local cluster (issue 13): node counts the
partition cannot give, pending jobs without Slurm's reason, `--wait --timeout` saying "ended"
for a job that had not, sbatch's message twice, and files left behind by a refused submission.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_jobs import wait_all

from hpcdp import slurm

pytestmark = pytest.mark.slurm

FAST = ["--set", "train.steps=2", "--set", "train.eval_interval=0",
        "--set", "data.corpus=synthetic"]


def hpcdp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_more_nodes_than_the_partition_has_is_refused_before_submitting(slurm_cluster,
                                                                        tmp_path):
    nodes = subprocess.run(["sinfo", "--noheader", "--format=%D", "--partition=debug"],
                           capture_output=True, text=True, check=True).stdout.split()
    total = sum(map(int, nodes))
    result = hpcdp("submit", "-s", "ddp", "-N", str(total + 1), "--out", str(tmp_path / "runs"),
                   *FAST, "--wait", "--timeout", "15", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"--nodes {total + 1}" in line and "partition debug" in line
    assert f"at most {total} node(s)" in line and "PartitionNodeLimit" in line
    assert not (tmp_path / "runs").exists() and "submitted job" not in result.stdout
    # compare's node counts come from the matrix: the line names where the count came from
    result = hpcdp("compare", "--set", f"matrix.nodes=[1,{total + 1}]", "--out",
                   str(tmp_path / "runs"), *FAST, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()  # the refusal alone, before any note
    assert f"matrix.nodes holds {total + 1}: partition debug" in line, line
    assert not (tmp_path / "runs").exists()


def test_a_pending_job_shows_slurms_reason_and_wait_says_it_gave_up(slurm_cluster, tmp_path):
    # --begin an hour from now: PENDING with reason BeginTime, whatever else the cluster runs.
    # The comment holds a space: rendered as --comment="a b", which sbatch keeps whole.
    extra = "cluster.extra_sbatch=['--begin=now+1hour', '--comment=a b']"
    result = hpcdp("submit", "-s", "single-gpu", "--out", str(tmp_path / "runs"), *FAST,
                   "--set", extra, "--wait", "--timeout", "4", cwd=tmp_path)
    job_id = result.stdout.split("submitted job ")[1].split(":")[0]
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"job {job_id}: PENDING (BeginTime)" in result.stdout
        assert "ended" not in result.stderr
        assert f"gave up waiting after 4 s: job {job_id} (single-gpu) is still PENDING " \
               "(BeginTime)" in result.stderr
        shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                               text=True, check=True).stdout
        assert "Comment=a b" in shown
        text = hpcdp("status", "--last", "1", cwd=tmp_path).stdout
        assert "PENDING (BeginTime)" in text
        (row,) = json.loads(hpcdp("status", "--last", "1", "--json", cwd=tmp_path).stdout)
        assert (row["job_id"], row["state"], row["reason"]) == (job_id, "PENDING", "BeginTime")
    finally:
        subprocess.run(["scancel", job_id], check=True)


def test_a_refused_submission_says_so_once_and_leaves_nothing(slurm_cluster, tmp_path):
    result = hpcdp("submit", "-s", "ddp", "-N", "2", "--set", "cluster.partition=nosuch",
                   "--out", str(tmp_path / "runs"), *FAST, cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "sbatch refused" in line and "nosuch" in line
    assert line.count("Invalid partition name specified") == 1, line
    assert not (tmp_path / "runs").exists()


def test_a_refused_resubmission_keeps_the_earlier_runs_files(slurm_cluster, tmp_path):
    """Refused into a folder an earlier run wrote: its experiment.yaml and script stay as
    they were."""
    first = hpcdp("render", "-s", "ddp", "-N", "2", "--out", str(tmp_path / "runs"), *FAST,
                  cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "runs" / "smoke" / "distributed-ps-2n"
    before = {p.name: p.read_text() for p in run_dir.iterdir()}
    again = hpcdp("submit", "-s", "ddp", "-N", "2", "--set", "cluster.partition=nosuch",
                  "--set", "train.steps=3", "--out", str(tmp_path / "runs"), *FAST[2:],
                  cwd=tmp_path)
    assert again.returncode == 2
    assert {p.name: p.read_text() for p in run_dir.iterdir()} == before


LONG = ["--set", "train.steps=5000", "--set", "train.eval_interval=0",
        "--set", "train.checkpoint_interval=0", "--set", "data.corpus=synthetic"]


def test_two_submits_into_one_run_folder_at_once_one_is_refused(slurm_cluster, tmp_path,
                                                                 monkeypatch):
    # issue 19, item 1: both were accepted, both jobs wrote one metrics.jsonl
    monkeypatch.setenv("HPCDP_STATE_DIR", str(tmp_path / "state"))
    cmd = [sys.executable, "-m", "hpcdp", "submit", "-s", "single-gpu", "--out",
           str(tmp_path / "runs"), *LONG]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    submitted = [out for code, out, _ in results if code == 0]
    try:
        assert sorted(code for code, _, _ in results) == [0, 2], results
        job_id = submitted[0].split("submitted job ")[1].split(":")[0]
        (refusal,) = [err for code, _, err in results if code == 2]
        (line,) = refusal.strip().splitlines()
        assert f"already belongs to job {job_id}" in line, line
    finally:
        for out in submitted:
            subprocess.run(["scancel", out.split("submitted job ")[1].split(":")[0]])


def test_a_script_sbatched_twice_by_hand_runs_once(slurm_cluster, tmp_path):
    # issue 19, item 1: the running job holds its run folder's lock; a second job of the same
    # script stops at once (HPCDP_LOCK_WAIT_S: how long it waits for the lock), naming the first
    rendered = hpcdp("render", "--strategy", "single-gpu", "--out", str(tmp_path / "runs"),
                     *LONG, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    script = Path(rendered.stdout.strip())
    env = {**os.environ, "HPCDP_LOCK_WAIT_S": "1"}

    def sbatch() -> str:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                              text=True, check=True, cwd=tmp_path, env=env)
        return done.stdout.strip().split(";")[0]

    first = sbatch()
    deadline = time.monotonic() + 120
    owner = script.parent / ".job.owner"
    while not (owner.exists() and owner.read_text().strip() == first):
        assert time.monotonic() < deadline, "the first job never took its run folder"
        time.sleep(0.5)
    second = sbatch()
    try:
        info = wait_all([second], timeout_s=120)[second]
        assert info.state == "FAILED", info
        log = (script.parent / f"slurm-{second}.out").read_text()
        assert f"is in use by job {first}; not starting job {second}" in log
        assert slurm.query_jobs([first])[first].state == "RUNNING"  # untouched
    finally:
        subprocess.run(["scancel", first, second])
