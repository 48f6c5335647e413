"""hpcdp/tracking.py with the real TensorBoard and MLflow back-ends, fed records as train/'s
MetricsWriter feeds them: the steps a resumed segment redoes are not sent twice, the same
MLflow run continues, a tracker failing mid-run is dropped with one warning, and the mapping of
records to keys leaves nulls out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tracker_files import mlflow_runs, tensorboard_scalars

from hpcdp import tracking


def _segment(run_dir: Path, names: list[str], start: int, end: int, loss_of, lines: list[str],
             status: str = "completed") -> dict:
    """One segment as train/ writes it: header, steps start+1..end into metrics.jsonl and the
    trackers (the TrackedRun is made before the header is written, as in train/loop.py)."""
    tracked = tracking.TrackedRun(names, run_dir, lines.append)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "a") as f:
        def write(record):
            f.write(json.dumps(record) + "\n")
            tracked.feed(record)
        write({"kind": "header", "time": 0.0, "start_step": start, "strategy": "ddp",
               "world_size": 2, "config": {"train": {"lr": 0.001}}})
        for step in range(start + 1, end + 1):
            write({"kind": "step", "time": float(step), "step": step, "loss": loss_of(step),
                   "lr": 0.001, "mfu": None, "phases_s": {"forward": 0.5}})
    return tracked.close({"status": status, "final_loss": loss_of(end)}, status)


def test_a_resume_from_an_earlier_checkpoint_sends_no_step_twice(tmp_path):
    """Killed after step 6 with its checkpoint at 4: the next segment redoes 5 and 6."""
    run, lines = tmp_path / "run", []
    first = _segment(run, ["tensorboard", "mlflow"], 0, 6, lambda s: 10.0 - s, lines,
                     status="interrupted")
    assert first["tensorboard"].startswith("wrote 6 step(s)")
    second = _segment(run, ["tensorboard", "mlflow"], 4, 9, lambda s: 20.0 - s, lines)
    assert second["mlflow"].startswith("wrote 3 step(s)")  # 7, 8, 9
    board = tensorboard_scalars(run / "tensorboard", "train/loss")
    assert [s for s, _ in board] == list(range(1, 10))
    # The first value of a redone step stays (5 and 6 from the first segment).
    assert dict(board)[6] == 4.0 and dict(board)[7] == 13.0
    (only,) = mlflow_runs(run / "mlruns", "hpcdp").values()
    assert [s for s, _ in only["history"]] == list(range(1, 10))
    assert only["status"] == "FINISHED" and only["params"]["config.train.lr"] == "0.001"
    assert [line for line in lines if "warning" in line] == []
    assert tensorboard_scalars(run / "tensorboard", "time/forward_s")[0] == (1, 0.5)


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path):
    run, lines = tmp_path / "run", []
    tracked = tracking.TrackedRun(["mlflow", "tensorboard"], run, lines.append)
    run.mkdir()
    tracked.feed({"kind": "header", "start_step": 0})
    for step in (1, 2):
        tracked.feed({"kind": "step", "step": step, "loss": 1.0, "time": 1.0})
    shutil.rmtree(run / "mlruns")
    (run / "mlruns").write_text("the store is gone\n")  # where MLflow writes: now a file
    for step in (3, 4, 5):
        tracked.feed({"kind": "step", "step": step, "loss": 1.0, "time": 1.0})
    report = tracked.close({"status": "completed"}, "completed")
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 1 and "tracker mlflow failed" in warnings[0], lines
    assert report["mlflow"].startswith("failed")
    assert report["tensorboard"].startswith("wrote 5 step(s)")


def test_records_map_to_tracker_keys_without_nulls():
    step = {"kind": "step", "step": 3, "loss": 2.5, "lr": 1e-3, "mfu": None, "skipped": False,
            "grad_norm": None, "phases_s": {"forward": 0.1, "sync": None}, "tokens_per_s": 10}
    assert tracking.step_scalars(step) == {"train/loss": 2.5, "train/lr": 1e-3,
                                           "perf/tokens_per_s": 10.0, "time/forward_s": 0.1}
    assert tracking.step_scalars({"kind": "eval", "step": 3, "val_loss": 2.0}) == {
        "val/loss": 2.0}
    params = tracking.header_params({"strategy": "fsdp", "config": {"train": {"lr": 1}},
                                     "versions": {"torch": "2.13"}})
    assert params == {"strategy": "fsdp", "config.train.lr": 1}
    assert tracking.summary_values({"status": "completed", "memory": {"peak_bytes": 5},
                                    "replicas_identical": True, "time": 9.0}) == {
        "memory.peak_bytes": 5.0}


@pytest.mark.parametrize("names", [["tensorboard", "neptune"], ["TensorBoard"]])
def test_an_unknown_tracker_is_refused_naming_the_valid_ones(names):
    with pytest.raises(tracking.UsageError, match="tensorboard, mlflow, wandb"):
        tracking.check_names(names)
