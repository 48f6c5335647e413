"""A rank that refuses to run says why in the job's log, even when srun drops its last output.

srun can end a step (--kill-on-bad-exit) before it forwards a failed task's last line: once in
a suite run, rank 0's "MASTER_ADDR is not rank 0's node" line never reached the log. So the rank
also writes the line to RUN_DIR/ranks/error-RANK, and the batch script prints it after "a rank
failed" where the log lacks it. These tests run the real `python -m train` and the real
rendered shell function; that srun drops the line cannot be provoked on demand.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hpcdp import config, render, strategies

ROOT = Path(__file__).resolve().parents[2]


def test_a_rank_that_refuses_to_run_writes_its_line_beside_its_exit(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrain: {steps: -3}\n")
    env = {**os.environ, "SLURM_PROCID": "3", "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None)

    def train(out: Path) -> str:
        done = subprocess.run([sys.executable, "-m", "train", "run", "--experiment", str(bad),
                               "--strategy", "distributed-ps", "--out", str(out)],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120)
        assert done.returncode == 2, done.stderr
        return done.stderr.strip()

    out = tmp_path / "run"
    out.mkdir()  # a job's script makes its run folder before the ranks start
    line = train(out)
    assert line.startswith("error: ") and "train.steps" in line and "\n" not in line
    assert (out / "ranks" / "error-3").read_text() == line + "\n"
    # a command line typed with a folder that is not there leaves none behind
    assert train(tmp_path / "typo") == line and not (tmp_path / "typo").exists()


def _ranks_said(tmp_path: Path) -> str:
    """The ranks_said function as the rendered job script defines it."""
    profile = config.load_profile("local", {"python": "/opt/venv/bin/python"})
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        job = render.render_job(profile, config.load_experiment("smoke"),
                                strategies.get("distributed-ps"), 2, output_dir="/runs")
    finally:
        os.chdir(old)
    found = re.search(r"^ranks_said\(\) \{.*?^\}$", job.text, re.S | re.M)
    assert found, "the rendered script defines ranks_said"
    return found.group(0)


def test_the_job_script_prints_what_a_rank_said_where_its_log_lacks_it(tmp_path):
    run = tmp_path / "run"
    (run / "ranks").mkdir(parents=True)
    heard = "error: rank 0 runs on 'node1' but MASTER_ADDR is 'node2'"
    lost = "error: cluster.env X is $(touch PWNED) `touch PWNED` not valid"
    (run / "ranks" / "error-0").write_text(heard + "\n")
    (run / "ranks" / "error-1").write_text(lost + "\n")
    (run / "slurm-42.out").write_text(f"hpcdp: job 42 started\n{heard}\nsrun: error: ...\n")
    script = _ranks_said(tmp_path) + '\nranks_said "$1"\n'
    done = subprocess.run(["bash", "-c", script, "bash", str(run)], capture_output=True,
                          text=True, env={**os.environ, "SLURM_JOB_ID": "42"}, cwd=tmp_path,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    # what the log already holds is not said twice; the lost line is, as text
    assert done.stdout == f"hpcdp: rank 1 said: {lost}\n"
    assert not list(tmp_path.rglob("PWNED"))
    # no log at all (a script run by hand elsewhere): every rank's line
    (run / "slurm-42.out").unlink()
    done = subprocess.run(["bash", "-c", script, "bash", str(run)], capture_output=True,
                          text=True, env={**os.environ, "SLURM_JOB_ID": "42"}, timeout=30)
    assert done.stdout.splitlines() == [f"hpcdp: rank 0 said: {heard}",
                                        f"hpcdp: rank 1 said: {lost}"]
