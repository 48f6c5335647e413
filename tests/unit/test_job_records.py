"""The jobs hpcdp knows: those it submitted, and those started by hand from a script it rendered
(issue 48, item 13: `hpcdp status` and `logs` called such a job "not submitted by hpcdp")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcdp import submit


def test_a_job_started_by_hand_from_a_rendered_script_is_known_by_its_log(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("HPCDP_STATE_DIR", str(tmp_path / "state"))
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--strategy", "ddp", "--nodes", "2",
         "--out", str(tmp_path / "runs")], cwd=tmp_path, capture_output=True, text=True,
        env=os.environ, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    run_dir = Path(rendered.stdout.strip()).parent
    assert submit.read_records() == []  # rendered, never started
    for name in ("slurm-41.out", "slurm-manual.out", "slurm-42.out"):
        (run_dir / name).write_text("hpcdp: job started\n")
    # 42 went through `hpcdp submit`: its own record, not a second one.
    submitted = {"job_id": "42", "run_dir": str(run_dir), "strategy": "distributed-ps",
                 "log": str(run_dir / "slurm-42.out"), "submitted_at": 1.0}
    submit.state_file().write_text(json.dumps(submitted) + "\n")
    records = submit.read_records()
    assert [(r["job_id"], r.get("by_hand", False)) for r in records] == [
        ("42", False), ("41", True)]
    by_hand = records[1]
    assert (by_hand["strategy"], by_hand["nodes"], by_hand["log"]) == (
        "distributed-ps", 2, str(run_dir / "slurm-41.out"))
    assert by_hand["project"] == submit.PROJECT  # `status` shows it in this checkout
