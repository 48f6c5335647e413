"""hpcdp harvest on metrics files WRITTEN BY REAL RUNS of `python -m train` (tiny model, CPU,
synthetic tokens): a completed run, a run killed mid-way (a cancelled job: no summary), the
same run resumed (two headers: what a requeue leaves), and copies of a real file cut mid-line
or with a corrupt line. The runs take about 20 s once per session (one thread each).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT, harvest
from hpcdp.harvest import read

TRAIN = [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--set", "data.corpus=synthetic"]
# One thread per run: the machine's cores are shared.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train(out: Path, *extra: str) -> None:
    proc = subprocess.run([*TRAIN, "--out", str(out), *extra], cwd=PROJECT_ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real-runs")
    runs = {"completed": root / "completed", "killed": root / "killed",
            "resumed": root / "resumed"}
    _train(runs["completed"], "--set", "train.steps=6")

    # A long run with a checkpoint every 3 steps, SIGKILLed once it has logged step 4 (what
    # scancel or a node failure does to the job), then copied before being resumed.
    steps = ["--set", "train.steps=40", "--set", "train.checkpoint_interval=3"]
    proc = subprocess.Popen([*TRAIN, "--out", str(runs["resumed"]), *steps], cwd=PROJECT_ROOT,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    metrics = runs["resumed"] / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            whole_lines = metrics.read_text().rpartition("\n")[0] if metrics.exists() else ""
            if any('"kind": "step", ' in ln and json.loads(ln)["step"] >= 4
                   for ln in whole_lines.splitlines()):
                break
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    runs["killed"].mkdir()
    shutil.copy(metrics, runs["killed"] / "metrics.jsonl")
    _train(runs["resumed"], *steps, "--resume")
    return runs


def test_completed_run(real_runs):
    path = real_runs["completed"]
    recs = _records(path / "metrics.jsonl")
    steps = [r for r in recs if r["kind"] == "step"]
    (r,) = harvest.harvest([path])  # no Slurm job id in a run outside Slurm: nothing asked
    assert (r.strategy, r.nodes, r.world_size, r.precision) == ("single-gpu", 1, 1, "fp32")
    assert r.state == "COMPLETED-by-log" and r.job_id is None
    assert r.steps == 6 and r.segments == 1 and r.restarts == 0
    # Steady steps are 3..6 (warmup_log_steps 2 in the smoke experiment).
    assert r.steady_steps == 4
    assert r.tokens_per_s == pytest.approx(statistics.median(s["tokens_per_s"] for s in steps[2:]))
    assert r.step_time_s == pytest.approx(statistics.median(s["step_time_s"] for s in steps[2:]))
    assert r.final_loss == steps[-1]["loss"]
    assert r.final_val_loss == [x for x in recs if x["kind"] == "eval"][-1]["val_loss"]
    assert r.mfu is None  # CPU: no known peak FLOP/s
    # Memory per rank (train/memory.py): on a CPU the peak RSS, and the model state one rank
    # holds: fp32 parameters, a gradient as large, AdamW's two moments per parameter.
    memory = recs[-1]["memory"]
    assert memory["measured"] == "peak_rss" and r.memory_measured == "peak_rss"
    assert r.peak_mem_gb == memory["peak_bytes"] / 1e9
    params = memory["params_bytes"]
    assert params > 0 and memory["grads_bytes"] == params
    assert 2 * params <= memory["optimizer_bytes"] < 2 * params + 4096  # + AdamW's step counts
    assert memory["peak_bytes"] > 4 * params  # the process holds far more than the model state
    assert r.state_gb == pytest.approx(4 * params / 1e9, rel=1e-3)
    assert r.notes == []


def test_killed_run_has_no_summary(real_runs):
    path = real_runs["killed"]
    log = read.read_metrics(path / "metrics.jsonl")
    assert log.summary is None and len(log.segments) == 1
    (r,) = harvest.harvest([path], now=log.last_time + 3600)
    assert r.state == "INCOMPLETE" and r.planned_steps == 40
    assert f"stopped at step {r.last_step} of 40" in r.notes
    (fresh,) = harvest.harvest([path], now=log.last_time + 1)
    assert fresh.state == "RUNNING-by-log"


def test_resumed_run_two_segments_last_value_per_step(real_runs):
    path = real_runs["resumed"]
    killed = read.read_metrics(real_runs["killed"] / "metrics.jsonl")
    log = read.read_metrics(path / "metrics.jsonl")
    assert len(log.segments) == 2
    resumed_at = log.segments[1].header["start_step"]
    assert resumed_at % 3 == 0 and 3 <= resumed_at <= killed.segments[0].last_step
    assert log.segments[1].header["resumed_from"]
    assert sorted(log.steps) == list(range(1, 41))
    # Steps the killed segment logged after its checkpoint were redone: the rerun's value wins.
    for n in range(resumed_at + 1, killed.segments[0].last_step + 1):
        assert log.steps[n]["_seg"] == 1
    (r,) = harvest.harvest([path])
    assert r.segments == 2 and r.restarts == 1 and r.state == "COMPLETED-by-log"
    assert "requeued/resumed 1x (2 segments)" in r.notes
    times = r.curve_time_s
    assert times == sorted(times)  # the time axis runs on across the restart
    assert times[-1] > log.segments[0].last_elapsed_s


def test_real_file_cut_mid_line(real_runs, tmp_path):
    text = (real_runs["completed"] / "metrics.jsonl").read_text()
    last_step_line = [ln for ln in text.splitlines() if '"kind": "step"' in ln][-1]
    cut_at = text.index(last_step_line) + len(last_step_line) // 2
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "metrics.jsonl").write_text(text[:cut_at])
    (r,) = harvest.harvest([tmp_path / "cut"], now=time.time() + 3600)
    assert r.truncated and r.corrupt_lines == 0
    assert r.steps == 5 and r.state == "INCOMPLETE"
    assert "last line cut mid-write" in r.notes


def test_real_file_with_a_corrupt_line(real_runs, tmp_path):
    lines = (real_runs["completed"] / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][: len(lines[3]) // 3] + "\n"  # a damaged record in the middle
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text("".join(lines))
    (r,) = harvest.harvest([tmp_path / "bad"])
    assert r.corrupt_lines == 1 and not r.truncated and r.steps == 5
    assert r.state == "COMPLETED-by-log"  # the summary is still there
    assert "1 corrupt line(s) skipped" in r.notes


def test_all_real_runs_together_with_plots(real_runs, tmp_path, capsys):
    out = tmp_path / "report"
    args = type("Args", (), {"paths": [str(real_runs["completed"].parent)], "format": "csv",
                             "out": str(out), "target_loss": None, "no_slurm": True,
                             "no_plots": False, "to": None, "wide": False})()
    assert harvest.main(args) == 0
    csv_text = capsys.readouterr().out
    assert len(csv_text.splitlines()) == 1 + 3
    assert (out / "loss_vs_time.png").stat().st_size > 5000


def test_fast_path_reads_the_real_writer_and_agrees_with_json(real_runs, tmp_path):
    text = (real_runs["resumed"] / "metrics.jsonl").read_text()
    step_lines = [ln for ln in text.splitlines() if ln.startswith(read._STEP_PREFIX)]
    # Every step line of train/metrics.py takes the fast path (else harvest is only slower:
    # if this fails after a change to the writer, update read._STEP_LINE).
    assert step_lines and all(read._STEP_LINE.fullmatch(ln) for ln in step_lines)
    # The same records with keys sorted miss the pattern and go through json.loads: same numbers.
    (tmp_path / "sorted").mkdir()
    (tmp_path / "sorted" / "metrics.jsonl").write_text("".join(
        json.dumps(json.loads(ln), sort_keys=True) + "\n" for ln in text.splitlines()))
    fast = read.read_metrics(real_runs["resumed"] / "metrics.jsonl")
    slow = read.read_metrics(tmp_path / "sorted" / "metrics.jsonl")
    assert not any(read._STEP_LINE.fullmatch(ln) for ln in
                   (tmp_path / "sorted" / "metrics.jsonl").read_text().splitlines())
    assert fast.steps == slow.steps and len(fast.steps) == 40
    for name in read.COLUMNS:  # every field, not only the steps (a field once went missing)
        assert getattr(fast.columns, name) == getattr(slow.columns, name), name
    assert fast.last_time == slow.last_time
    assert [s.offset_s for s in fast.segments] == [s.offset_s for s in slow.segments]
