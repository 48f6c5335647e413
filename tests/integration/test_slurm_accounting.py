"""hpcdp.slurm and hpcdp harvest against the real local cluster (slurmdbd accounting on).

Real sbatch jobs: one exits 0, one exits 3, one is scancel'ed while running, one is requeued
with `scontrol requeue` while running and then finishes. query_jobs must see them live through
squeue, then report COMPLETED / FAILED 3 / CANCELLED / the requeue from sacct. About 40 s,
most of it Slurm restarting the requeued job and sacct's ~5 s lag.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from slurm_jobs import wait_all

from hpcdp import harvest, slurm

pytestmark = pytest.mark.slurm

DEADLINE_S = 120  # bounds a hang; the jobs themselves take seconds


@pytest.fixture(scope="module")
def cluster_env(request) -> dict[str, str]:
    try:
        request.getfixturevalue("slurm_cluster")
    except pytest.FixtureLookupError:
        pytest.skip("no slurm_cluster fixture in tests/conftest.py yet")
    assert os.environ.get("SLURM_CONF"), "slurm_cluster did not export SLURM_CONF"
    return dict(os.environ)


def _run(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def _sbatch(out_dir: Path, script: str, *extra: str) -> str:
    result = _run("sbatch", "--parsable", "--mem=64M", "--requeue", f"--chdir={out_dir}",
                  f"--output={out_dir}/slurm-%j.out", *extra, f"--wrap={script}")
    job_id = result.stdout.strip().split(";")[0]
    assert result.returncode == 0 and job_id.isdigit(), result.stderr
    return job_id


def _wait_live_state(job_id: str, state: str) -> slurm.JobInfo:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        info = slurm.query_jobs([job_id])[job_id]
        if info.state == state and info.source == "squeue":
            return info
        time.sleep(0.5)
    pytest.fail(f"job {job_id} never reached {state} in squeue (last: {info})")


@pytest.fixture(scope="module")
def jobs(cluster_env, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("acct")
    ids = {
        "ok": _sbatch(out, "sleep 1; echo done"),
        "fail": _sbatch(out, "sleep 1; echo 'error: something broke' >&2; exit 3"),
        "cancel": _sbatch(out, "sleep 300"),
        # The first run waits to be requeued; the rerun (SLURM_RESTART_COUNT=1) ends at once.
        "requeue": _sbatch(out, 'echo "run ${SLURM_RESTART_COUNT:-0}"; '
                                '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || sleep 300'),
    }
    running = _wait_live_state(ids["requeue"], "RUNNING")
    assert running.restarts == 0
    assert _run("scontrol", "requeue", ids["requeue"]).returncode == 0
    _wait_live_state(ids["cancel"], "RUNNING")
    assert _run("scancel", ids["cancel"]).returncode == 0
    wait_all(list(ids.values()), timeout_s=DEADLINE_S)
    ids["dir"] = str(out)
    return ids


def test_final_states_come_from_sacct(jobs):
    table = slurm.query_jobs([jobs[k] for k in ("ok", "fail", "cancel", "requeue")])
    assert table.accounting_available is True
    ok, fail, cancel, requeue = (table[jobs[k]] for k in ("ok", "fail", "cancel", "requeue"))
    assert all(info.source == "sacct" for info in (ok, fail, cancel, requeue))
    assert (ok.state, ok.exit_code) == ("COMPLETED", 0)
    assert (fail.state, fail.exit_code) == ("FAILED", 3)
    assert cancel.state == "CANCELLED" and cancel.raw_state.startswith("CANCELLED")
    assert (requeue.state, requeue.exit_code, requeue.restarts) == ("COMPLETED", 0, 1)
    assert ok.node_list and ok.num_nodes == 1 and ok.elapsed_s is not None
    log = (Path(jobs["dir"]) / f"slurm-{jobs['requeue']}.out").read_text()
    assert "run 1" in log  # the rerun happened (same job id, same log)


def test_requeue_visible_in_raw_sacct(jobs):
    out = _run("sacct", "--noheader", "--parsable2", "--duplicates", "-X",
               f"--jobs={jobs['requeue']}", "--format=JobID,State").stdout
    assert [line.split("|")[1] for line in out.split()] == ["REQUEUED", "COMPLETED"]


def test_unknown_and_forgotten_ids(jobs):
    # One id alone makes squeue exit 1 ("Invalid job id specified"): not a failure.
    table = slurm.query_jobs(["1"])
    assert table["1"].state == "UNKNOWN" and table.accounting_available is True


def test_accounting_disabled_keeps_squeue(jobs, tmp_path, cluster_env):
    # The same cluster's slurm.conf without accounting: sacct says so, exit 1.
    conf = Path(cluster_env["SLURM_CONF"])
    lines = [ln for ln in conf.read_text().splitlines() if not ln.startswith("AccountingStorage")]
    (tmp_path / "slurm.conf").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "slurm.conf")}
    table = slurm.query_jobs([jobs["ok"]], env=env)
    assert table.accounting_available is False
    assert "accounting storage is disabled" in table.accounting_message
    assert table[jobs["ok"]].state == "UNKNOWN"
    assert slurm.query_jobs([jobs["ok"]]).accounting_available is True  # the real cluster


def test_harvest_takes_state_and_exit_code_from_sacct(jobs, tmp_path):
    # A run dir for the failed job: HAND-WRITTEN metrics (a header and two steps, schema of
    # docs/architecture.md) naming the real job, and the job's real Slurm log.
    run = tmp_path / "exp" / "distributed-ps-1n"
    run.mkdir(parents=True)
    header = {"kind": "header", "time": time.time(), "strategy": "distributed-ps",
              "precision": "fp32", "world_size": 2, "nodes": 1, "start_step": 0,
              "slurm_job_id": jobs["fail"], "restart_count": 0, "experiment": "exp",
              "config": {"train": {"steps": 10, "warmup_log_steps": 0}}}
    steps = [{"kind": "step", "time": time.time(), "step": i, "loss": 3.0, "tokens_per_s": 10.0,
              "step_time_s": 0.1, "elapsed_s": 0.1 * i} for i in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [header, *steps]))
    log = Path(jobs["dir"]) / f"slurm-{jobs['fail']}.out"
    (run / log.name).write_text(log.read_text())
    (r,) = harvest.harvest([tmp_path])
    assert (r.state, r.state_source, r.exit_code, r.job_id) == ("FAILED", "sacct", 3, jobs["fail"])
    assert "failed with exit code 3" in r.notes
    assert "stopped at step 2 of 10" in r.notes
    assert any(n.startswith("1 error line(s) in slurm log, first: error: something broke")
               for n in r.notes)
