"""Experiment trackers (hpcdp/tracking.py, docs/tracking.md), read back with each tracker's own
reader (tracker_files.py):

- a 2-node DDP job on the local cluster with TensorBoard, MLflow and W&B (offline), stopped by
  Slurm's time-limit signal at step 4, requeued and resumed (tests/conftest.py's
  `requeued_ddp`): each tracker holds one run with every step exactly once, equal to
  metrics.jsonl's losses;
- a tracker whose package is missing and one that fails (an MLflow store it cannot write) cost
  one warning line each, and the run trains to the end;
- `hpcdp harvest --to tensorboard|mlflow` exports a run that trained without trackers, once.
A campaign's grouping is checked in test_sharded_strategies.py's campaign (one campaign fewer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import REQUEUED_DDP_PAUSE, REQUEUED_DDP_STEPS, TRACKERS, logs, records, sets
from tracker_files import mlflow_runs, tensorboard_scalars, wandb_runs

ROOT = Path(__file__).resolve().parents[2]
STEPS, PAUSE_AT = REQUEUED_DDP_STEPS, REQUEUED_DDP_PAUSE


def _losses(recs: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in recs if r["kind"] == "step"}  # the last record wins


def _summaries(recs: list[dict]) -> list[dict]:
    return [r for r in recs if r["kind"] == "summary"]


@pytest.fixture(scope="module")
def resumed_run(requeued_ddp) -> Path:
    """tests/conftest.py's stopped DDP job: the trackers on, an evaluation at steps 5 and 10,
    paused at step 4 until Slurm's USR2, requeued, resumed (test_resume_every_strategy.py
    holds its losses to the straight job's)."""
    info, run_dir = requeued_ddp["infos"]["stopped"], requeued_ddp["stopped"]
    assert info.state == "COMPLETED" and info.restarts == 1, logs(run_dir)[-4000:]
    return run_dir


@pytest.mark.slurm
def test_each_tracker_holds_one_run_with_every_step_once_after_a_requeue(resumed_run):
    recs = records(resumed_run)
    assert [h["start_step"] for h in recs if h["kind"] == "header"] == [0, PAUSE_AT]
    losses = _losses(recs)
    expected = [(s, losses[s]) for s in range(1, STEPS + 1)]

    # TensorBoard: one log dir, every step once (event files hold float32).
    board = tensorboard_scalars(resumed_run / "tensorboard", "train/loss")
    assert [s for s, _ in board] == list(range(1, STEPS + 1))
    assert [v for _, v in board] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert [s for s, _ in tensorboard_scalars(resumed_run / "tensorboard", "val/loss")] == [5, 10]

    # MLflow: one run in the default file store, continued by the second segment.
    (run,) = mlflow_runs(resumed_run / "mlruns", "hpcdp").values()
    assert run["history"] == expected and run["status"] == "FINISHED"
    assert run["params"]["strategy"] == "distributed-ps" and run["params"]["world_size"] == "2"

    # W&B offline: a folder per segment, one id, every step once over both.
    segments = wandb_runs(resumed_run / "wandb")
    assert len(segments) == 2 and len({s["id"] for s in segments}) == 1
    assert sorted(p for s in segments for p in s["history"]) == expected

    state = json.loads((resumed_run / "tracking.json").read_text())
    assert state["wandb_id"] == segments[0]["id"]
    assert [v for k, v in state.items() if k.startswith("mlflow_run_id")] == [run["id"]]
    first, last = _summaries(recs)
    assert first["status"] == "interrupted" and last["status"] == "completed"
    assert set(last["trackers"]) == {"tensorboard", "mlflow", "wandb"}
    # The second segment sent only its own steps: 5..10.
    assert all(w.startswith(f"wrote {STEPS - PAUSE_AT} step(s)")
               for w in last["trackers"].values()), last["trackers"]
    assert "train: tracking to tensorboard (" in logs(resumed_run)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "MLFLOW_", "WANDB_"))}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)} | extra


def test_a_missing_or_failing_tracker_costs_one_warning_and_training_goes_on(tmp_path):
    # wandb "not installed": a module of that name that fails to import, first on the path.
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "wandb.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where MLflow wants its store\n")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--out", str(out), *sets("train.steps=4", "data.corpus=synthetic", TRACKERS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=_env({"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}",
                  "MLFLOW_TRACKING_URI": (blocked / "mlruns").as_uri()}))
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "warning: tracker" in line]
    assert len(warnings) == 2, done.stdout
    assert "tracker wandb not installed (pip install 'hpcdp[wandb]')" in warnings[1]
    assert "tracker mlflow failed to start" in warnings[0]
    assert all(w.endswith("training goes on without it") for w in warnings)
    (summary,) = _summaries(records(out))
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert summary["trackers"]["tensorboard"].startswith("wrote 4 step(s)")
    assert summary["trackers"]["wandb"].startswith("not installed")
    assert [s for s, _ in tensorboard_scalars(out / "tensorboard", "train/loss")] == [1, 2, 3, 4]


def test_harvest_exports_a_run_without_trackers_once(tmp_path):
    out = tmp_path / "runs" / "plain"
    trained = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--out", str(out), *sets("train.steps=3", "data.corpus=synthetic")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env({}))
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert not (out / "tensorboard").exists() and not (out / "tracking.json").exists()
    expected = sorted(_losses(records(out)).items())

    def harvest(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hpcdp", "harvest", str(tmp_path / "runs"),
                               "--no-slurm", "-f", "json", *args], capture_output=True,
                              text=True, timeout=120, env=_env({}))

    for tracker, dest in (("tensorboard", tmp_path / "tb"), ("mlflow", tmp_path / "ml")):
        first = harvest("--to", tracker, str(dest))
        assert first.returncode == 0, first.stderr
        assert f"exported 1 of 1 run(s) to {tracker}" in first.stderr
        again = harvest("--to", tracker, str(dest))
        assert "already in" in again.stderr and "exported 0 of 1" in again.stderr, again.stderr
    board = tensorboard_scalars(tmp_path / "tb" / "hpcdp" / "plain", "train/loss")
    assert [s for s, _ in board] == [s for s, _ in expected]
    assert [v for _, v in board] == pytest.approx([v for _, v in expected], rel=1e-6)
    (run,) = mlflow_runs(tmp_path / "ml", "hpcdp").values()
    assert run["history"] == expected and run["status"] == "FINISHED"
    assert not (out / "tracking.json").exists(), "an export leaves the run folder alone"
