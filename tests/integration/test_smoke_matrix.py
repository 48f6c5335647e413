"""The demo's path end to end: the smoke experiment's whole matrix (every strategy that fits the
local cluster, on 1 and 2 nodes) submitted by `hpcdp submit --wait`, then `hpcdp harvest`, whose
table must hold every run with plausible values and job states from slurmdbd's accounting."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from hpcdp import config

pytestmark = pytest.mark.slurm


def test_smoke_matrix_then_harvest(slurm_cluster, tmp_path):
    # One of each launch (the other cells add process starts, not paths: they are trained in
    # test_resume_every_strategy.py, test_train_strategies.py and test_horovod_slurm.py).
    strategies = [s for s in config.load_experiment("smoke").matrix.strategies
                  if s in ("single-gpu", "distributed-ps")]
    runs = tmp_path / "runs"
    # A prepared folder of its own: the matrix's prepare job must tokenize, the cells must not.
    submit = subprocess.run(
        [sys.executable, "-m", "hpcdp", "submit", "--experiment", "smoke", "--wait",
         "--out", str(runs), "--set", "train.steps=12", "--set", "train.eval_interval=6",
         "--set", f"matrix.strategies=[{', '.join(strategies)}]",
         "--set", f"data.prepared_dir={tmp_path / 'prepared'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert submit.returncode == 0, submit.stdout[-4000:] + submit.stderr[-2000:]
    expected = {(s.name, n) for s, n in config.load_experiment(
        "smoke", {"matrix": {"strategies": strategies}}).matrix.cells()}
    assert submit.stdout.count("submitted job") == len(expected) + 1
    assert submit.stdout.splitlines()[0].endswith(": prepares the data; the cells start after it")
    (prepare_log,) = (runs / "smoke" / "prepare").glob("slurm-*.out")
    assert "tokenized" in prepare_log.read_text()
    for cell_log in runs.glob("smoke/*-*n/slurm-*.out"):
        text = cell_log.read_text()
        assert "already prepared" in text and "tokenized" not in text, cell_log

    out = tmp_path / "harvest"
    harvest = subprocess.run(
        [sys.executable, "-m", "hpcdp", "harvest", str(runs), "--format", "json", "--out",
         str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert harvest.returncode == 0, harvest.stderr
    report = json.loads(harvest.stdout)
    assert report["accounting"]["available"] is True
    rows = report["runs"]
    assert {(r["strategy"], r["nodes"]) for r in rows} == expected
    for row in rows:
        assert row["state"] == "COMPLETED" and row["state_source"] == "sacct", row
        assert row["job_id"] and row["exit_code"] == 0
        assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0
        assert row["steps"] == 12
        assert row["final_val_loss"] is not None
    # The same data and seed for every strategy: the byte-level model learns in 12 steps.
    for run_dir in runs.glob("smoke/*-*n"):
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in steps if r["kind"] == "step"]
        assert losses[-1] < losses[0] - 0.5, (run_dir.name, losses)
    # single-gpu on one node is the baseline of the speed-up column
    baseline = [r for r in rows if r["strategy"] == "single-gpu"][0]
    assert baseline["speedup"] == pytest.approx(1.0)
    for name in ("table.md", "table.csv", "runs.json"):
        assert (out / name).stat().st_size > 0
    for png in ("throughput_vs_nodes.png", "loss_vs_time.png", "memory_vs_throughput.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100
