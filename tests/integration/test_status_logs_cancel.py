"""`hpcdp status` with progress, `hpcdp logs` and `hpcdp cancel`, on a real job of the local
cluster (issue 12, item 3)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp import slurm

pytestmark = pytest.mark.slurm

sys.path.insert(0, str(Path(__file__).parent))
from test_submit import hpcdp, wait_final  # noqa: E402

# Long enough to be caught running (about 30 ms a step here), logged every 5 steps.
LONG = ["--set", "train.steps=5000", "--set", "train.log_interval=5",
        "--set", "train.eval_interval=0", "--set", "train.checkpoint_interval=0"]


def wait_for_steps(run_dir: Path, at_least: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and sum('"kind": "step"' in line
                                    for line in metrics.read_text().splitlines()) >= at_least:
            return
        time.sleep(0.5)
    raise AssertionError(f"{metrics}: fewer than {at_least} step records after {timeout_s} s")


def test_status_shows_progress_logs_print_and_cancel_stops_the_job(slurm_cluster, tmp_path,
                                                                   monkeypatch):
    # Its own job records: `cancel --all` must see only this test's job.
    monkeypatch.setenv("HPCDP_STATE_DIR", str(tmp_path / "state"))
    submitted = hpcdp("submit", "--strategy", "single-gpu", "--out", str(tmp_path / "runs"),
                      *LONG, cwd=tmp_path)
    job_id = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    run_dir = Path(re.search(r"run:\s+(\S+)", submitted.stdout).group(1))
    try:
        wait_for_steps(run_dir, 3)
        rows = {r["job_id"]: r for r in json.loads(hpcdp("status", "--json", cwd=tmp_path).stdout)}
        done = rows[job_id]["progress"]
        assert rows[job_id]["state"] == "RUNNING"
        assert done["total_steps"] == 5000 and 15 <= done["step"] < 5000
        assert done["eta_s"] > 0 and done["tokens_per_s"] > 0 and done["loss"] > 0
        text = hpcdp("status", cwd=tmp_path).stdout
        assert re.search(r"\d+/5000 loss \d+\.\d+ [\d,]+ tok/s ETA \S+", text), text

        log = hpcdp("logs", job_id, cwd=tmp_path).stdout
        assert f"hpcdp: job {job_id} restart 0 strategy single-gpu" in log
        assert "step 5/5000 | loss" in log

        cancelled = hpcdp("cancel", job_id, cwd=tmp_path)
        assert cancelled.stdout.strip() == f"cancelled 1 job(s): {job_id}"
    finally:
        slurm.cancel([job_id])
    assert wait_final(job_id).state == "CANCELLED"
    # issue 36, item 7: an ended job shows how far it got, with no time left ("ETA 0s" was)
    row = re.search(rf"^\s*{job_id}\s.*\n(.*)", hpcdp("status", cwd=tmp_path).stdout, re.M)
    assert "CANCELLED" in row.group(0) and re.search(r"\d+/5000", row.group(1)), row.group(0)
    assert "ETA" not in row.group(0), row.group(0)
    # --follow returns once the job has ended, with the whole log.
    followed = hpcdp("logs", "--follow", job_id, cwd=tmp_path, timeout=120).stdout
    assert "SIGTERM (preemption or scancel)" in followed
    # issue 19, item 8: a job that already ended is named as such, not "cancelled"
    again = hpcdp("cancel", job_id, cwd=tmp_path).stdout
    assert f"already ended, nothing to cancel: {job_id} (CANCELLED)" in again
    assert "cancelled 1 job" not in again


def shows(text: str, job_id: str) -> bool:
    """Whether a `hpcdp status` table has a row of this job (ids are right-aligned first)."""
    return re.search(rf"^\s*{job_id}\s", text, re.MULTILINE) is not None


def on_a_terminal(*args: str, cwd: Path) -> str:
    """What `hpcdp ARGS` writes to a terminal (a pseudo-terminal: stdout.isatty() is true)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hpcdp", *args], cwd=cwd, stdout=follower,
                            stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the program ended and closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
        assert proc.wait(timeout=60) == 0, out
    return out.decode("utf-8", "replace")


def test_another_checkouts_job_is_neither_shown_nor_cancelled_by_cancel_all(slurm_cluster,
                                                                             tmp_path,
                                                                             monkeypatch):
    # issue 19, item 8: the job registry is per user; `cancel --all` keeps to this checkout
    monkeypatch.setenv("HPCDP_STATE_DIR", str(tmp_path / "state"))
    registry = tmp_path / "state" / "jobs.jsonl"
    ids = []
    try:
        for out in ("mine", "theirs"):
            submitted = hpcdp("submit", "--strategy", "single-gpu", "--out",
                              str(tmp_path / out), *LONG, cwd=tmp_path)
            ids.append(re.search(r"submitted job (\d+)", submitted.stdout).group(1))
        mine, theirs = ids
        # The second job becomes another checkout's, as a second clone of the same user writes
        # it: same registry, another `project`. It is live (pending or running) from here on.
        records = [json.loads(line) for line in registry.read_text().splitlines()]
        assert [r["job_id"] for r in records] == ids
        records[1]["project"] = "/elsewhere/hpcdp"
        registry.write_text("".join(json.dumps(r) + "\n" for r in records))

        status = hpcdp("status", cwd=tmp_path).stdout
        assert "(1 job(s) of other checkouts not shown: --all-projects shows them)" in status
        assert shows(status, mine) and not shows(status, theirs)
        assert shows(hpcdp("status", "--all-projects", cwd=tmp_path).stdout, theirs)

        cancelled = hpcdp("cancel", "--all", cwd=tmp_path).stdout.splitlines()
        assert cancelled == [f"cancelled 1 job(s): {mine}",
                             "(1 pending or running job(s) of other checkouts left alone: "
                             "--all-projects cancels them too)"]
        assert wait_final(mine).state == "CANCELLED"
        assert slurm.query_jobs([theirs])[theirs].source == "squeue"  # still pending/running
        assert hpcdp("cancel", "--all", cwd=tmp_path).stdout.splitlines()[0] == (
            "hpcdp: no job submitted from this checkout is pending or running")

        # issue 19, item 12: on a terminal --watch redraws in place; the count of other
        # checkouts' jobs is part of the frame, not printed once before the first redraw
        # cleared it (this checkout's job has ended: one frame, then it returns).
        screen = on_a_terminal("status", "--watch", "0.5", cwd=tmp_path)
        frame = screen.split("\033[H\033[J")[-1]
        assert "\033[H\033[J" in screen and "other checkouts not shown" in frame, screen
        assert shows(frame, mine) and not shows(frame, theirs)

        everything = hpcdp("cancel", "--all", "--all-projects", cwd=tmp_path).stdout
        assert everything.strip() == f"cancelled 1 job(s): {theirs}"
        assert wait_final(theirs).state == "CANCELLED"
    finally:
        if ids:
            slurm.cancel(ids)


NOT_HPCDPS = "job '1' was neither submitted by hpcdp nor started from a script it rendered"


@pytest.mark.parametrize("argv, says", [
    (["logs", "1"], NOT_HPCDPS),
    (["cancel", "1"], NOT_HPCDPS),
    (["cancel"], "name job ids, or --all"),
])
def test_jobs_hpcdp_did_not_submit_are_refused_in_one_line(slurm_cluster, tmp_path, argv, says):
    result = hpcdp(*argv, cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_ctrl_c_while_waiting_says_the_job_keeps_running(slurm_cluster, tmp_path, monkeypatch):
    # issue 19, item 7: Ctrl-C stops the following, not the job, and says how to go on
    import signal
    import subprocess

    monkeypatch.setenv("HPCDP_STATE_DIR", str(tmp_path / "state"))
    # Ctrl-C's SIGINT as at a terminal. A command that a script starts in the background (`&`)
    # inherits SIGINT ignored, and Python then keeps ignoring it: so does this test's pytest
    # when the suite runs that way, and the SIGINT below was lost (seen here, 2026-12-06).
    proc = subprocess.Popen([sys.executable, "-m", "hpcdp", "submit", "--strategy", "single-gpu",
                             "--out", str(tmp_path / "runs"), "--wait", *LONG], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    job_id = None
    try:
        for line in proc.stdout:
            found = re.search(r"submitted job (\d+)", line)
            if found:
                job_id = found.group(1)
                break
        assert job_id, "no job submitted"
        time.sleep(2)  # in the follow loop
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert f"job(s) {job_id} keep running" in err and f"hpcdp cancel {job_id}" in err
        assert slurm.query_jobs([job_id])[job_id].source == "squeue"  # still queued or running
    finally:
        if proc.poll() is None:
            proc.kill()
        if job_id:
            slurm.cancel([job_id])
