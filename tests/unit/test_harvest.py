"""hpcdp harvest on HAND-WRITTEN metrics files: the arithmetic of every column, the outputs, the
CLI's errors. Files written by real runs of `python -m train` (a cancelled one, a resumed one,
cut and corrupted copies) are tested in tests/integration/test_harvest_real.py.

HAND-WRITTEN FIXTURES: `write_run` below writes metrics.jsonl in the schema of
docs/architecture.md with chosen numbers, so that each expected value can be computed by hand
(a real CPU run's throughput is noise). Only the fields harvest reads are filled.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import statistics
from pathlib import Path

import pytest

from hpcdp import harvest
from hpcdp.errors import UsageError
from hpcdp.harvest import read, repeats

T0 = 1_800_000_000.0  # record times: a fixed epoch, far from "now" unless a test says so


def header(strategy: str, nodes: int, world: int, precision: str = "fp32", *,
           start_step: int = 0, job: str | None = None, restart_count: int = 0,
           warmup_log_steps: int = 2, steps: int = 10, experiment: str = "exp",
           communication: str | None = None, global_batch: int | None = None,
           grad_comm: str | None = None, malloc: str | None = None,
           container: str | None = None) -> dict:
    """HAND-WRITTEN header record (docs/metrics.md), the fields harvest uses."""
    return {"kind": "header", "time": T0, "strategy": strategy, "precision": precision,
            "communication": communication, "global_batch_size": global_batch,
            "grad_comm": grad_comm, "malloc": malloc, "container": container,
            "world_size": world, "nodes": nodes, "tasks_per_node": world // nodes,
            "device": "cpu", "start_step": start_step, "resumed_from": None,
            "slurm_job_id": job, "restart_count": restart_count, "experiment": experiment,
            "tokens_per_step": 1000,
            "config": {"name": experiment, "train": {"steps": steps,
                                                     "warmup_log_steps": warmup_log_steps}}}


def step(n: int, loss: float, tps: float, elapsed: float, *, dt: float | None = None,
         mem: float | None = None, mfu: float | None = None) -> dict:
    """HAND-WRITTEN step record."""
    return {"kind": "step", "time": T0 + elapsed, "step": n, "loss": loss, "lr": 1e-3,
            "grad_norm": 1.0, "loss_scale": None, "skipped": False,
            "step_time_s": dt if dt is not None else 1000.0 / tps, "tokens_per_s": tps,
            "tokens_seen": n * 1000, "elapsed_s": elapsed, "max_mem_gb": mem, "mfu": mfu}


def summary(steps: int, loss: float) -> dict:
    return {"kind": "summary", "time": T0 + 100, "status": "completed", "steps": steps,
            "final_loss": loss, "final_val_loss": None, "elapsed_s": 10.0,
            "tokens_per_s_median": None, "step_time_s_median": None}


def write_run(path: Path, records: list[dict], tail: str = "") -> Path:
    """Write HAND-WRITTEN records as metrics.jsonl (+ raw `tail` text, e.g. a cut line)."""
    path.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (path / "metrics.jsonl").write_text(text)
    return path


def simple_run(path: Path, strategy: str, nodes: int, world: int, tps: float,
               precision: str = "fp32", losses=(4.0, 3.5, 3.0, 2.5, 2.0), **kw) -> Path:
    """A finished run: two slow warm-up steps (tps/10), then steady steps at `tps`."""
    recs = [header(strategy, nodes, world, precision, steps=len(losses), **kw)]
    elapsed = 0.0
    for i, loss in enumerate(losses, start=1):
        rate = tps / 10 if i <= 2 else tps
        elapsed += 1000.0 / rate
        recs.append(step(i, loss, rate, elapsed))
    recs.append({"kind": "eval", "time": T0 + elapsed, "step": len(losses),
                 "val_loss": losses[-1] + 0.1})
    recs.append(summary(len(losses), losses[-1]))
    return write_run(path, recs)


def run_one(path: Path, **kw) -> harvest.RunResult:
    results = harvest.harvest([path], query_slurm=False, **kw)
    assert len(results) == 1
    return results[0]


# --------------------------------------------------------------------------- reading


def test_steady_median_leaves_out_warmup_steps(tmp_path):
    r = run_one(simple_run(tmp_path / "a", "single-gpu", 1, 1, tps=1000.0))
    assert r.tokens_per_s == 1000.0  # the two warm-up steps (100 tok/s) are not in the median
    assert r.step_time_s == pytest.approx(1.0)
    assert r.steady_steps == 3 and r.steps == 5
    assert r.state == "COMPLETED-by-log" and r.state_source == "log"
    assert (r.final_loss, r.final_val_loss) == (2.0, 2.1)
    assert r.notes == []


def test_warmup_log_steps_comes_from_the_header_config(tmp_path):
    r = run_one(simple_run(tmp_path / "a", "single-gpu", 1, 1, tps=1000.0, warmup_log_steps=0))
    assert r.steady_steps == 5 and r.tokens_per_s == 1000.0  # median of 100,100,1000,1000,1000


def test_requeued_run_two_headers_last_value_per_step(tmp_path):
    # Segment 1 logs steps 1-4 and dies; segment 2 resumes from a step-2 checkpoint and
    # redoes 3-4 (new values win) then 5-6. Restarts come from the header's restart_count.
    recs = [header("distributed-ps", 1, 2, job="77", steps=6),
            step(1, 5.0, 100, 10), step(2, 4.9, 100, 20), step(3, 9.9, 100, 30),
            step(4, 9.8, 100, 40),
            header("distributed-ps", 1, 2, job="77", start_step=2, restart_count=1, steps=6),
            step(3, 4.8, 500, 2), step(4, 4.7, 500, 4), step(5, 4.6, 500, 6),
            step(6, 4.5, 500, 8), summary(6, 4.5)]
    r = run_one(write_run(tmp_path / "rq", recs))
    assert (r.segments, r.restarts, r.steps) == (2, 1, 6)
    assert r.curve_loss == [5.0, 4.9, 4.8, 4.7, 4.6, 4.5] and r.curve_step == [1, 2, 3, 4, 5, 6]
    # Steady: steps > start_step + 2 in each segment: 3,4 of segment 1 were replaced; in
    # segment 2 (start 2) steps 5 and 6 are steady.
    assert r.steady_steps == 2 and r.tokens_per_s == 500
    # Training time continues across segments: segment 1 lasted 40 s.
    assert r.curve_time_s == [10, 20, 42, 44, 46, 48]
    assert any("requeued/resumed 1x (2 segments)" in n for n in r.notes)
    assert r.job_id == "77"


def test_cancelled_run_without_summary(tmp_path):
    recs = [header("horovod", 2, 4, steps=10)] + [step(i, 5 - i / 10, 800, i) for i in (1, 2, 3)]
    path = write_run(tmp_path / "c", recs)
    r = run_one(path, now=T0 + 3600)  # an hour after the last record
    assert r.state == "INCOMPLETE"
    assert "stopped at step 3 of 10" in r.notes
    fresh = run_one(path, now=T0 + 10)
    assert fresh.state == "RUNNING-by-log"
    assert not any("stopped" in n for n in fresh.notes)


@pytest.mark.parametrize("state, stopped", [
    ("REQUEUED", False), ("SUSPENDED", False), ("CONFIGURING", False), ("RESIZING", False),
    ("RUNNING", False), ("PENDING", False), ("ENDING", False), ("RUNNING-by-log", False),
    ("CANCELLED by 0", True), ("TIMEOUT", True), ("PREEMPTED", True), ("INCOMPLETE", True)])
def test_stopped_note_only_once_the_job_has_ended(tmp_path, state, stopped):
    # A live job (Slurm's word) has not stopped, whatever its state is called.
    recs = [header("horovod", 2, 4, steps=10)] + [step(i, 5 - i / 10, 800, i) for i in (1, 2, 3)]
    path = write_run(tmp_path / "c", recs)
    log = read.read_metrics(path / "metrics.jsonl")
    r = harvest.summarize_log(path, log)
    r.state = state
    notes = harvest._notes(r, log, None, read.SlurmLogScan())
    assert ("stopped at step 3 of 10" in notes) is stopped


def test_cut_last_line_is_reported_not_fatal(tmp_path):
    recs = [header("single-gpu", 1, 1)] + [step(i, 3.0, 1000, i) for i in (1, 2, 3)]
    cut = json.dumps(step(4, 2.9, 1000, 4))[:37]
    r = run_one(write_run(tmp_path / "t", recs, tail=cut), now=T0 + 3600)
    assert r.truncated and r.corrupt_lines == 0 and r.steps == 3
    assert "last line cut mid-write" in r.notes


def test_corrupt_line_in_the_middle_is_counted(tmp_path):
    recs = [header("single-gpu", 1, 1)] + [step(i, 3.0, 1000, i) for i in (1, 2, 3)]
    path = write_run(tmp_path / "x", recs)
    lines = (path / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines.insert(2, "\x00\x00garbage{not json\n")
    lines.insert(3, "[1, 2]\n")  # valid JSON, not a record
    (path / "metrics.jsonl").write_text("".join(lines))
    r = run_one(path)
    assert r.corrupt_lines == 2 and not r.truncated and r.steps == 3
    assert "2 corrupt line(s) skipped" in r.notes


def test_cut_line_glued_to_the_next_header_is_recovered(tmp_path):
    # Killed mid-write, then requeued: the new header lands on the cut line's end.
    first = [header("single-gpu", 1, 1, job="9"), step(1, 3.0, 1000, 1)]
    cut = json.dumps(step(2, 2.9, 1000, 2))[:50]
    second = [header("single-gpu", 1, 1, job="9", restart_count=1, start_step=1),
              step(2, 2.8, 1000, 1), summary(2, 2.8)]
    text = "".join(json.dumps(r) + "\n" for r in first) + cut + "".join(
        json.dumps(r) + "\n" for r in second)
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "metrics.jsonl").write_text(text)
    log = read.read_metrics(tmp_path / "g" / "metrics.jsonl")
    assert (log.corrupt_lines, log.recovered_records, len(log.segments)) == (1, 1, 2)
    assert log.steps[2]["loss"] == 2.8 and log.summary is not None


def test_empty_and_headerless_files(tmp_path):
    write_run(tmp_path / "empty", [])
    write_run(tmp_path / "nohead", [step(1, 3.0, 1000, 1)])
    results = {Path(r.run_dir).name: r for r in
               harvest.harvest([tmp_path], query_slurm=False, now=T0 + 3600)}
    assert results["empty"].steps == 0 and "no step records" in results["empty"].notes
    assert results["empty"].state == "INCOMPLETE"
    assert results["nohead"].steps == 1 and "no header record" in results["nohead"].notes


def test_job_id_from_submission_json(tmp_path):
    path = simple_run(tmp_path / "s", "single-gpu", 1, 1, tps=10.0)
    (path / "submission.json").write_text(json.dumps({"job_id": "4242", "strategy": "x"}))
    assert run_one(path).job_id == "4242"


def test_slurm_log_traceback_becomes_a_note(tmp_path):
    import subprocess
    import sys

    path = simple_run(tmp_path / "f", "single-gpu", 1, 1, tps=10.0)
    # A real traceback, printed by a real interpreter, as Slurm's log would hold it.
    code = "def f():\n raise RuntimeError('boom: nccl')\nf()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    (path / "slurm-555.out").write_text("step 1/5 | loss 4.0\n" + proc.stderr)
    r = run_one(path)
    assert "slurm-555.out: RuntimeError: boom: nccl" in r.notes
    # A later log without a traceback (a requeued job's second log): the note still names the
    # file the exception was read from, not the last file scanned.
    (path / "slurm-556.out").write_text("step 1/5 | loss 4.0\n")
    r = run_one(path)
    assert "slurm-555.out: RuntimeError: boom: nccl" in r.notes
    assert not any(n.startswith("slurm-556.out") for n in r.notes)


def test_slurm_log_error_lines_become_a_note(tmp_path):
    path = simple_run(tmp_path / "e", "single-gpu", 1, 1, tps=10.0)
    (path / "slurm-556.out").write_text(
        "step 1/5\nslurmstepd: error: *** JOB 556 ON node1 CANCELLED AT 2026-11-30T05:15:15 "
        "DUE TO TIME LIMIT ***\n")
    (notes,) = [n for n in run_one(path).notes if "error line" in n]
    assert notes.startswith("1 error line(s) in slurm log, first: slurmstepd: error: *** JOB 556")


# A time-limit requeue's first segment, as the local cluster's job log has it.
PLANNED_STOP_LOG = """hpcdp: job 71 restart 0 strategy distributed-ps nodes node[1-2] world 2
hpcdp: time limit near: checkpointing, then requeueing job 71
srun: error: node2: task 1: Exited with exit code 143
slurmstepd-node1: error: *** STEP 71.0 ON node1 CANCELLED AT 2026-12-07T16:04:35 ***
srun: error: node1: task 0: Exited with exit code 143
hpcdp: job 71 restart 1 strategy distributed-ps nodes node[1-2] world 2
"""


@pytest.mark.parametrize("log, errors", [
    (PLANNED_STOP_LOG, 0),  # issue 48, item 10: the planned exit 143 read as 3 error lines
    (PLANNED_STOP_LOG.replace("hpcdp: time limit near: checkpointing, then requeueing job 71\n",
                              ""), 3),  # 143 with no stop planned: a failure's echo, counted
    (PLANNED_STOP_LOG + "srun: error: node2: task 1: Exited with exit code 1\n", 1),
])
def test_a_planned_stop_is_not_an_error_line(tmp_path, log, errors):
    path = simple_run(tmp_path / "p", "distributed-ps", 2, 2, tps=10.0)
    (path / "slurm-71.out").write_text(log)
    said = [n for n in run_one(path).notes if "error line" in n]
    assert said == ([f"{errors} error line(s) in slurm log, first: srun: error: node2: task 1: "
                     f"Exited with exit code {1 if errors == 1 else 143}"] if errors else [])


def test_find_run_dirs_recursive_and_pruned(tmp_path):
    simple_run(tmp_path / "exp" / "single-gpu-1n", "single-gpu", 1, 1, tps=10.0)
    simple_run(tmp_path / "exp" / "ddp-2n", "distributed-ps", 2, 4, tps=10.0)
    (tmp_path / "exp" / "ddp-2n" / "checkpoints").mkdir()
    (tmp_path / "exp" / "ddp-2n" / "checkpoints" / "metrics.jsonl").write_text("")
    found = read.find_run_dirs([tmp_path, tmp_path / "exp" / "ddp-2n" / "metrics.jsonl"])
    assert sorted(p.name for p in found) == ["ddp-2n", "single-gpu-1n"]


# --------------------------------------------------------------------------- comparisons


@pytest.fixture
def matrix(tmp_path) -> Path:
    """HAND-WRITTEN runs of one experiment: throughputs chosen for round ratios."""
    root = tmp_path / "runs" / "exp"
    simple_run(root / "single-gpu-1n", "single-gpu", 1, 1, tps=1000.0,
               losses=(4.0, 3.6, 3.2, 3.0, 2.9))
    simple_run(root / "distributed-ps-1n", "distributed-ps", 1, 2, tps=1800.0,
               losses=(4.0, 3.5, 3.0, 2.5, 2.0))
    simple_run(root / "distributed-ps-2n", "distributed-ps", 2, 4, tps=3000.0,
               losses=(4.0, 3.4, 2.8, 2.3, 1.9))
    simple_run(root / "distributed-ps-apex-2n", "distributed-ps-apex", 2, 4, tps=6000.0,
               precision="fp16", losses=(4.0, 3.4, 2.8, 2.3, 1.9))
    return tmp_path / "runs"


def _two_node_probe(folder: Path, busbw: float) -> None:
    """HAND-WRITTEN allreduce.json of a 2-node gloo probe (hpcdp compare's baseline)."""
    folder.mkdir(parents=True)
    nbytes = 4 << 20
    seconds = nbytes * 2 * (2 - 1) / 2 / (busbw * 1e9)
    (folder / "allreduce.json").write_text(json.dumps({
        "communication": "gloo", "nodes": 2, "world_size": 2, "median_s": seconds,
        "sweep": [{"bytes": nbytes, "median_s": seconds, "algbw_GBps": busbw,
                   "busbw_GBps": busbw}]}))


@pytest.mark.parametrize("end_busbw, changed", [(0.108, False), (0.029, True)])
def test_a_network_that_changed_during_a_campaign_gets_no_call_across_nodes(
        tmp_path, end_busbw, changed):
    """Its 2-node probe at 0.11 GB/s at the start and 0.029 at the end (a link slowed to a
    quarter, as `hpcdp cluster link --rate` does): the cells ran on two networks, so the
    verdict across nodes names the change and calls no winner, where the same runs with a
    steady network are called. tests/integration/test_cluster.py slows a real link."""
    campaign = tmp_path / "campaign"
    campaign.mkdir()
    (campaign / "campaign.json").write_text(json.dumps({"cells": []}))
    for k in range(1, 7):
        simple_run(campaign / "distributed-ps-2n" / f"repeat-{k}", "distributed-ps", 2, 2,
                   tps=3000.0 + 10 * k)
        simple_run(campaign / "horovod-2n" / f"repeat-{k}", "horovod", 2, 2, tps=2000.0 + 10 * k)
    _two_node_probe(campaign / "baseline" / "distributed-ps-2n", 0.11)
    _two_node_probe(campaign / "baseline-end" / "distributed-ps-2n", end_busbw)
    result = harvest.collect([campaign], query_slurm=False)
    (verdict,) = [v for v in result.verdicts if v["nodes"] == 2]
    if changed:
        assert verdict["outcome"] == "undecided", verdict
        assert verdict["text"].startswith(
            "no call on 2 node(s): the network changed during the campaign: gloo busbw on 2 "
            "nodes -74% at its end against its start; as measured: "), verdict["text"]
        assert {c.vs_fastest for c in result.cells} == {"no call: network changed"}
    else:
        assert verdict["outcome"] == "faster" and "network" not in verdict["text"], verdict


def test_speedup_and_both_efficiencies(matrix):
    rows = {(r.strategy, r.nodes): r for r in harvest.harvest([matrix], query_slurm=False)}
    assert [k for k in rows] == [("single-gpu", 1), ("distributed-ps", 1), ("distributed-ps", 2),
                                 ("distributed-ps-apex", 2)]  # registry order, then nodes
    ddp2 = rows[("distributed-ps", 2)]
    assert ddp2.speedup == pytest.approx(3.0)
    assert ddp2.scaling_efficiency == pytest.approx(3000 / (2 * 1800))
    assert ddp2.efficiency_vs_single == pytest.approx(3000 / (4 * 1000))
    # scaling means something only on more than one node (issue 18: a 1-node "144%")
    assert rows[("distributed-ps", 1)].scaling_efficiency is None
    assert rows[("single-gpu", 1)].speedup == pytest.approx(1.0)
    # No 1-node fp16 run: no scaling efficiency for it, but a speed-up over fp32 single-gpu.
    amp = rows[("distributed-ps-apex", 2)]
    assert amp.scaling_efficiency is None and amp.speedup == pytest.approx(6.0)


def test_time_to_default_target_is_the_highest_final_loss(matrix):
    results = harvest.collect([matrix], query_slurm=False)
    assert results.target_loss == 2.9  # single-gpu's final loss: every run reaches it
    rows = {(r.strategy, r.nodes): r for r in results.runs}
    one = rows[("single-gpu", 1)]
    assert one.step_to_target == 5  # its last step
    # Elapsed: warm-up steps take 10 s each at 100 tok/s, then 1 s per step.
    assert one.time_to_target_s == pytest.approx(10 + 10 + 1 + 1 + 1)
    ddp1 = rows[("distributed-ps", 1)]
    assert ddp1.step_to_target == 4  # losses 4.0, 3.5, 3.0, 2.5: first <= 2.9 at step 4
    assert ddp1.time_to_target_s == pytest.approx(2 * 1000 / 180 + 2 * 1000 / 1800)
    assert all(r.time_to_target_s is not None for r in results.runs)


def test_explicit_target_loss(matrix):
    rows = {(r.strategy, r.nodes): r for r in harvest.harvest([matrix], target_loss=2.0,
                                                             query_slurm=False)}
    assert rows[("single-gpu", 1)].time_to_target_s is None  # never got to 2.0
    assert rows[("distributed-ps", 1)].step_to_target == 5
    assert rows[("distributed-ps", 2)].step_to_target == 5  # 1.9 <= 2.0 first at step 5


def test_baseline_is_per_experiment(tmp_path):
    simple_run(tmp_path / "a" / "sg", "single-gpu", 1, 1, tps=1000.0, experiment="a")
    simple_run(tmp_path / "b" / "sg", "single-gpu", 1, 1, tps=500.0, experiment="b")
    simple_run(tmp_path / "b" / "ddp", "distributed-ps", 1, 2, tps=1000.0, experiment="b")
    rows = {(r.experiment, r.strategy): r for r in harvest.harvest([tmp_path], query_slurm=False)}
    assert rows[("b", "distributed-ps")].speedup == pytest.approx(2.0)
    text = harvest.render(harvest.collect([tmp_path], query_slurm=False), "table")
    assert text.splitlines()[0].startswith("experiment")  # shown when several experiments


# --------------------------------------------------------------------------- outputs and CLI


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    harvest.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_csv_and_json_round_trip(matrix, capsys):
    assert harvest.main(_args(str(matrix), "--format", "csv", "--no-slurm")) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 4 and float(rows[2]["speedup"]) == pytest.approx(3.0)
    assert harvest.main(_args(str(matrix), "--format", "json", "--no-slurm")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target_loss"] == 2.9 and len(data["runs"]) == 4
    assert data["runs"][0]["strategy"] == "single-gpu" and "curve_loss" not in data["runs"][0]


def test_markdown_and_table(matrix, capsys):
    assert harvest.main(_args(str(matrix), "-f", "markdown", "--no-slurm")) == 0
    lines = capsys.readouterr().out.splitlines()
    # header, rule, 4 runs, blank, target, blank, the baseline named
    assert lines[0].startswith("| strategy | nodes |") and len(lines) == 2 + 4 + 2 + 2
    assert "| distributed-ps | 2 | 4 | - | fp32 | - | COMPLETED-by-log |" in lines[4]
    assert lines[-1].startswith("Speed-up and efficiency vs 1 GPU are against ")
    assert harvest.main(_args(str(matrix), "--no-slurm")) == 0
    table = capsys.readouterr().out
    assert "3.00x" in table and "83.3%" in table and "75.0%" in table
    assert "are against " in table.splitlines()[-1]


def test_out_dir_writes_tables_and_plots(matrix, tmp_path, capsys):
    out = tmp_path / "report"
    assert harvest.main(_args(str(matrix), "--out", str(out), "--no-slurm")) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["loss_vs_time.png", "runs.json", "table.csv", "table.md",
                     "throughput_vs_nodes.png"]
    for png in ("loss_vs_time.png", "throughput_vs_nodes.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert json.loads((out / "runs.json").read_text())["runs"][1]["strategy"] == "distributed-ps"


def test_loss_vs_time_names_cells_not_runs_and_keeps_its_size_at_300_runs(tmp_path):
    """Issue 48, item 11: 300 runs made a legend of 300 entries, a 1088 x 5712 px image."""
    import dataclasses
    import struct

    from hpcdp.harvest import plots

    base = run_one(simple_run(tmp_path / "a", "single-gpu", 1, 1, tps=1000.0))
    runs = [dataclasses.replace(base, strategy=f"s{cell % 15}", nodes=1 + cell // 15,
                                world_size=1 + cell // 15, curve_time_s=[0.0, 1.0 + rep],
                                curve_loss=[5.0, 4.0 - 0.01 * rep])
            for cell in range(30) for rep in range(10)]
    fig = plots.loss_vs_time_figure(runs, target_loss=4.5)
    entries = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(entries) == 31 and entries[0] == "s0 1n (10 runs)" and entries[-1] == \
        "target 4.500"
    plots.loss_vs_time(runs, tmp_path / "loss.png", 4.5)
    width, height = struct.unpack(">II", (tmp_path / "loss.png").read_bytes()[16:24])
    assert width <= 1600 and height <= 800, (width, height)


def test_memory_per_rank_is_the_largest_segment_and_is_plotted_against_throughput(tmp_path):
    root = tmp_path / "runs"
    for name, tps, peak in (("single-gpu", 1000.0, 3e9), ("distributed-ps", 1800.0, 5e9)):
        run = simple_run(root / name, name, 1, 1, tps=tps)
        recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        memory = {"measured": "peak_rss", "peak_bytes": peak, "params_bytes": 1e8,
                  "grads_bytes": 1e8, "optimizer_bytes": 2e8}
        recs[-1]["memory"] = memory
        # A resumed segment peaked lower: the run's figure is its largest segment's.
        second = [header(name, 1, 1, start_step=5, steps=5), {
            **summary(5, 2.0), "memory": {**memory, "peak_bytes": peak / 2}}]
        write_run(run, recs + second)
    results = {r.strategy: r for r in harvest.harvest([root], query_slurm=False)}
    assert results["distributed-ps"].peak_mem_gb == 5.0 and results["single-gpu"].peak_mem_gb == 3.0
    assert results["single-gpu"].state_gb == pytest.approx(0.4)
    assert results["single-gpu"].memory_measured == "peak_rss"
    out = tmp_path / "report"
    assert harvest.main(_args(str(root), "--out", str(out), "--no-slurm")) == 0
    data = (out / "memory_vs_throughput.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "mem/rank GB" in (out / "table.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["{tmp}/nowhere"], "does not exist"),
    (["{tmp}"], "no metrics.jsonl found in"),
    (["{run}", "--format", "xlsx"], "--format 'xlsx' is not valid"),
    (["{run}", "--format", "jsn"], "did you mean 'json'?"),
    (["{run}", "--target-loss", "-1"], "--target-loss '-1' must be a positive number"),
    (["{run}", "--target-loss", "nan"], "must be a positive number"),
    (["{run}/metrics.jsonl/x"], "does not exist"),
])
def test_bad_input_is_a_one_line_usage_error(tmp_path, argv, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = simple_run(tmp_path / "run", "single-gpu", 1, 1, tps=10.0)
    argv = [a.format(tmp=empty, run=run) for a in argv]
    with pytest.raises(UsageError) as exc:
        harvest.main(_args(*argv, "--no-slurm"))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_cli_wiring_exit_2(tmp_path, capsys):
    from hpcdp import cli

    assert cli.main(["harvest", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcdp: error: path ") and err.count("\n") == 1


def test_null_numbers_in_step_lines(tmp_path):
    # The writer turns NaN/inf into null (a diverged fp16 step); such values are left out.
    recs = [header("single-gpu", 1, 1, warmup_log_steps=0)] + [
        step(i, 3.0, 1000, i) for i in (1, 2, 3)]
    recs[2]["loss"] = None
    recs[3]["mfu"] = None
    recs[1]["mfu"] = recs[2]["mfu"] = 0.5
    r = run_one(write_run(tmp_path / "n", recs))
    assert r.steps == 3 and r.curve_step == [1, 3] and r.mfu == 0.5 and r.corrupt_lines == 0


def test_scaling_reference_has_the_same_ranks_per_node_and_duplicates_say_so(tmp_path):
    simple_run(tmp_path / "a" / "ddp-1n-2", "distributed-ps", 1, 2, tps=1800.0)
    simple_run(tmp_path / "a" / "ddp-1n-4", "distributed-ps", 1, 4, tps=3000.0)
    simple_run(tmp_path / "a" / "ddp-2n-4", "distributed-ps", 2, 4, tps=3000.0)
    simple_run(tmp_path / "b" / "ddp-2n-4", "distributed-ps", 2, 4, tps=2000.0)
    rows = harvest.harvest([tmp_path], query_slurm=False)
    assert [(r.nodes, r.world_size) for r in rows] == [(1, 2), (1, 4), (2, 4), (2, 4)]
    assert rows[2].scaling_efficiency == pytest.approx(3000 / (2 * 1800))  # 2/node vs 2/node
    assert rows[3].notes == ["same configuration as a/ddp-2n-4"]


def test_a_run_on_another_allocator_than_the_baseline_says_so(tmp_path):
    """train.malloc: auto gives DDP tcmalloc but Horovod's MPI ranks glibc's malloc on CPUs."""
    simple_run(tmp_path / "single", "single-gpu", 1, 1, tps=1000.0, malloc="tcmalloc")
    simple_run(tmp_path / "ddp", "distributed-ps", 2, 2, tps=1800.0, malloc="tcmalloc")
    simple_run(tmp_path / "hvd", "horovod", 2, 2, tps=1500.0, malloc="system")
    simple_run(tmp_path / "old", "horovod", 1, 1, tps=900.0)  # written before `malloc`
    rows = {Path(r.run_dir).name: r for r in harvest.harvest([tmp_path], query_slurm=False)}
    notes = {name: [n for n in r.notes if "malloc" in n] for name, r in rows.items()}
    assert notes["hvd"] == ["ran with malloc system, single with tcmalloc: on CPUs that alone "
                            "changes step time"]
    assert notes["single"] == notes["ddp"] == notes["old"] == []
    assert rows["hvd"].malloc == "system" and rows["old"].malloc is None


def test_horovod_controllers_are_rows_of_their_own(tmp_path):
    simple_run(tmp_path / "mpi", "horovod", 2, 2, tps=2000.0, communication="horovod-mpi")
    simple_run(tmp_path / "gloo", "horovod", 2, 2, tps=1500.0, communication="horovod-gloo")
    rows = harvest.harvest([tmp_path], query_slurm=False)
    assert sorted(r.communication for r in rows) == ["horovod-gloo", "horovod-mpi"]
    assert all(not any("same configuration" in n for n in r.notes) for r in rows)


def test_a_number_only_the_pattern_accepts_is_a_corrupt_line(tmp_path):
    # "1-2" fits the fast pattern's number shape but is not JSON: read like any other line.
    recs = [header("single-gpu", 1, 1)] + [step(i, 3.0, 1000, i) for i in (1, 2, 3)]
    path = write_run(tmp_path / "n", recs)
    text = (path / "metrics.jsonl").read_text().replace('"loss": 3.0, "lr"', '"loss": 1-2, "lr"', 1)
    (path / "metrics.jsonl").write_text(text)
    log = read.read_metrics(path / "metrics.jsonl")
    assert log.corrupt_lines == 1 and sorted(log.steps) == [2, 3]


# ------------------------------------------------------------ what may be compared (issue 13)


def _with_train(path: Path, **train) -> Path:
    """Rewrite a run's header config with other training settings (HAND-WRITTEN)."""
    lines = (path / "metrics.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["config"]["train"].update(train)
    (path / "metrics.jsonl").write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return path


def test_runs_trained_differently_are_not_compared(tmp_path):
    simple_run(tmp_path / "a" / "single-gpu-1n", "single-gpu", 1, 1, tps=1000.0)
    simple_run(tmp_path / "a" / "distributed-ps-2n", "distributed-ps", 2, 2, tps=1800.0)
    simple_run(tmp_path / "b" / "single-gpu-1n", "single-gpu", 1, 1, tps=500.0)
    _with_train(simple_run(tmp_path / "b" / "distributed-ps-2n", "distributed-ps", 2, 2,
                           tps=3100.0), micro_batch_size=32)
    rows = {r.run_dir.split(str(tmp_path) + "/")[1]: r
            for r in harvest.harvest([tmp_path], query_slurm=False)}
    odd = rows["b/distributed-ps-2n"]
    # Compared with nothing: not 3.10x over a/single-gpu-1n, and its own group has no baseline.
    assert odd.speedup is None and odd.scaling_efficiency is None and odd.baseline is None
    (note,) = [n for n in odd.notes if n.startswith("trained differently")]
    assert "train.micro_batch_size=32 (there None)" in note and "not compared" in note
    # b/single-gpu-1n is trained like a/: same configuration, and a/ (first by rule) leads.
    assert rows["a/distributed-ps-2n"].speedup == pytest.approx(1.8)
    assert rows["a/distributed-ps-2n"].baseline == "a/single-gpu-1n"
    assert "same configuration as a/single-gpu-1n" in rows["b/single-gpu-1n"].notes
    assert not any("same configuration" in n for n in odd.notes)


def test_the_baseline_is_a_finished_run_never_a_cancelled_one_by_folder_order(tmp_path):
    # "a-cancelled" sorts first by folder name but stopped at step 3 of 10 without a summary.
    recs = [header("single-gpu", 1, 1, steps=5)] + [
        step(i, 5 - i / 10, 9000.0, i) for i in (1, 2, 3, 4)]
    write_run(tmp_path / "a-cancelled", recs)
    simple_run(tmp_path / "b-done", "single-gpu", 1, 1, tps=1000.0)
    simple_run(tmp_path / "c-ddp", "distributed-ps", 2, 2, tps=1500.0)
    rows = {Path(r.run_dir).name: r
            for r in harvest.harvest([tmp_path], query_slurm=False, now=T0 + 3600)}
    assert rows["c-ddp"].baseline == "b-done" and rows["c-ddp"].speedup == pytest.approx(1.5)
    assert rows["a-cancelled"].speedup == pytest.approx(9.0)  # measured against b-done too
    assert "same configuration as b-done" in rows["a-cancelled"].notes
    lines = harvest.table.baseline_lines(list(rows.values()))
    assert lines == [lines[0]] and "against b-done" in lines[0]


def test_a_stopped_run_has_one_note_with_or_without_an_interrupted_summary(tmp_path):
    steps = [step(i, 5 - i / 10, 800, i) for i in (1, 2, 3)]
    interrupted = {**summary(3, 4.7), "status": "interrupted"}
    write_run(tmp_path / "signalled", [header("horovod", 2, 4, steps=10), *steps, interrupted])
    write_run(tmp_path / "cut", [header("horovod", 2, 4, steps=10), *steps], tail='{"kind": "st')
    rows = {Path(r.run_dir).name: r
            for r in harvest.harvest([tmp_path], query_slurm=False, now=T0 + 3600)}
    for name in ("signalled", "cut"):
        assert "stopped at step 3 of 10" in rows[name].notes, (name, rows[name].notes)
    assert rows["signalled"].state == rows["cut"].state == "INCOMPLETE"


# --------------------------------------------------------------------------- repeats


def _campaign(tmp_path: Path, tokens: dict[tuple[str, int], list[float]],
              name: str = "compare", record: dict | None = None, **kwargs) -> Path:
    """A campaign folder as hpcdp compare leaves it: campaign.json and one run per repeat."""
    root = tmp_path / name
    for (strategy, nodes), values in tokens.items():
        for k, tps in enumerate(values, start=1):
            simple_run(root / f"{strategy}-{nodes}n" / f"repeat-{k}", strategy, nodes, nodes,
                       tps, **kwargs)
    (root / "campaign.json").write_text(json.dumps(record or {"exclusive": True}))
    return root


def test_repeats_become_cells_with_intervals_and_a_verdict(tmp_path):
    root = _campaign(tmp_path, {
        ("single-gpu", 1): [1000.0, 1010.0, 990.0],
        ("distributed-ps", 1): [1005.0, 995.0, 1015.0],   # the same within noise
        ("distributed-ps", 2): [1900.0, 1910.0, 1890.0, 1905.0],
        ("horovod", 2): [1500.0, 1490.0, 1510.0, 1495.0],         # clearly slower on 2 nodes
    })
    result = json.loads(harvest.render(harvest.collect([root], query_slurm=False), "json"))
    cells = {c["cell"]: c for c in result["cells"]}
    assert set(cells) == {"single-gpu 1n", "distributed-ps 1n", "distributed-ps 2n",
                          "horovod 2n"}
    ddp2 = cells["distributed-ps 2n"]
    assert ddp2["repeats"] == 4 and ddp2["tokens_per_s_median"] == 1902.5
    assert ddp2["source"] == str(root)
    # 4 runs allow no 95% interval of a median: the range, with the confidence it has
    iv = ddp2["tokens_per_s_interval"]
    assert (iv["low"], iv["high"], iv["attained"]) == (1890.0, 1910.0, False)
    assert iv["confidence"] == pytest.approx(1 - 2 * 0.5 ** 4)
    assert cells["single-gpu 1n"]["speedup"] == {"estimate": 1.0, "interval": None}
    assert ddp2["speedup"]["estimate"] == pytest.approx(1.9, rel=0.01)
    assert cells["distributed-ps 1n"]["scaling_efficiency"] is None  # 1 node: none
    eff = ddp2["scaling_efficiency"]
    # within the extreme run-by-run ratios (exp/log rounding aside)
    assert 1890 / (2 * 1015) * (1 - 1e-12) <= eff["interval"]["low"] <= eff["estimate"] \
        <= eff["interval"]["high"] <= 1910 / (2 * 995) * (1 + 1e-12)
    verdict = {v["nodes"]: v for v in result["verdict"]}
    # 3 runs per cell give the ratio no 95% interval (the smallest exact p at 3 vs 3 is 0.1):
    # neither a winner nor "equally fast" can be said, and the line says how many runs can
    assert verdict[1]["outcome"] == "too few repeats"
    assert "cannot tell 2 strategies apart; 4 needed" in verdict[1]["text"]
    assert verdict[2]["outcome"] == "faster" and verdict[2]["fastest"] == "distributed-ps 2n"
    (vs_horovod,) = verdict[2]["comparisons"]
    assert vs_horovod["p"] == pytest.approx(2 / 70)  # completely separated, 4 vs 4
    assert cells["horovod 2n"]["vs_fastest"].startswith("slower")
    text = harvest.render(harvest.collect([root], query_slurm=False), "table")
    assert "Per cell, over runs" in text and "repeat 2 of 4" in text
    assert f"Source: campaign {root} (nodes exclusive)" in text


def test_single_runs_get_no_repeats_section(tmp_path):
    root = _campaign(tmp_path, {("single-gpu", 1): [1000.0], ("distributed-ps", 2): [1800.0]})
    text = harvest.render(harvest.collect([root], query_slurm=False), "table")
    assert "Per cell, over runs" not in text
    cells = json.loads(harvest.render(harvest.collect([root], query_slurm=False), "json"))["cells"]
    assert [c["repeats"] for c in cells] == [1, 1]


def test_time_to_target_compares_one_global_batch_only(tmp_path):
    simple_run(tmp_path / "a", "distributed-ps", 1, 1, 1000.0, global_batch=8,
               losses=(4.0, 3.5, 3.0, 2.5, 2.2))
    simple_run(tmp_path / "b", "distributed-ps", 2, 2, 1800.0, global_batch=16,
               losses=(4.0, 3.4, 2.8, 2.2, 1.8))
    runs = {Path(r.run_dir).name: r for r in harvest.harvest([tmp_path], query_slurm=False)}
    assert (runs["a"].global_batch, runs["b"].global_batch) == (8, 16)
    # Each batch gets its own default target: its own highest final loss.
    assert (runs["a"].target_loss, runs["b"].target_loss) == (2.2, 1.8)
    text = harvest.render(harvest.collect([tmp_path], query_slurm=False), "table")
    assert "time to target compares runs of one global batch only" in text
    assert "batch 8: target 2.2000; batch 16: target 1.8000" in text


def test_a_loss_that_drifts_from_the_fp32_reference_is_flagged(tmp_path):
    simple_run(tmp_path / "fp32", "distributed-ps", 2, 2, 1800.0, global_batch=16,
               communication="gloo", losses=(4.0, 3.5, 3.0, 2.5, 2.0))
    close = (4.0, 3.5, 3.001, 2.501, 2.0)
    simple_run(tmp_path / "bf16", "distributed-ps", 2, 2, 1900.0, global_batch=16,
               communication="gloo", losses=close, grad_comm="bf16")
    simple_run(tmp_path / "broken", "horovod", 2, 2, 1900.0, global_batch=16,
               communication="horovod-mpi", losses=(4.0, 3.5, 3.0, 2.7, 2.2), grad_comm="fp16")
    runs = {Path(r.run_dir).name: r for r in harvest.harvest([tmp_path], query_slurm=False)}
    assert runs["bf16"].communication == "gloo/bf16"
    assert runs["bf16"].parity_reference == "fp32" and runs["fp32"].loss_drift is None
    assert runs["bf16"].loss_drift == pytest.approx(0.001 / 2.5)  # the largest, at step 4
    assert not any("maths changed" in n for n in runs["bf16"].notes)
    assert runs["broken"].loss_drift == pytest.approx(0.2 / 2.0)
    assert any("loss drifts 10.0% from fp32 at step 5" in n and "maths changed" in n
               for n in runs["broken"].notes)


def _probe(folder: Path, busbw: dict[int, float], *, world: int = 2,
           communication: str | None = "gloo", gradient: int = 2_000_000) -> None:
    """HAND-WRITTEN allreduce.json (train/allreduce.py): busbw per message size, the gradient's
    size at the top level (world 2: algbw = busbw)."""
    sweep = [{"what": "gradient" if n == gradient else "", "bytes": n, "elements": n // 4,
              "iterations": 20, "times_s": [n / bw / 1e9] * 20, "median_s": n / bw / 1e9,
              "algbw_GBps": bw * world / (2 * (world - 1)), "busbw_GBps": bw}
             for n, bw in sorted(busbw.items())]
    top = next(e for e in sweep if e["what"] == "gradient")
    folder.mkdir(parents=True)
    (folder / "allreduce.json").write_text(json.dumps({
        "strategy": "distributed-ps", "communication": communication, "nodes": 2,
        "world_size": world, **{k: v for k, v in top.items() if k != "what"},
        "warmup": 5, "sweep": sweep}))


def _with_comm(root: Path, pattern: str, **fields) -> None:
    """Set step fields (allreduce_s, exposed_comm_s, ...) in every run matching `pattern`."""
    for metrics in root.glob(pattern):
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
        write_run(metrics.parent, [{**r, **fields} if r["kind"] == "step" else r for r in recs])


def test_the_network_baseline_is_shown_and_explains_each_cell(tmp_path):
    root = _campaign(tmp_path, {("distributed-ps", 2): [1800.0, 1820.0]}, communication="gloo")
    # Training all-reduced 2 MB per step in 2 buckets (1 MB each) in 0.2 s: busbw 0.01 GB/s.
    _with_comm(root, "distributed-ps-2n/repeat-*/metrics.jsonl", allreduce_s=0.2,
               allreduce_bytes=2_000_000, allreduce_calls=2, exposed_comm_s=0.05)
    # The probe: 0.01 GB/s at 500 kB, 0.03 at 2 MB: 0.02 at 1 MB (linear in log size).
    _probe(root / "baseline" / "distributed-ps-2n", {500_000: 0.01, 2_000_000: 0.03})
    (root / "baseline" / "broken").mkdir()
    (root / "baseline" / "broken" / "allreduce.json").write_text("{not json")
    result = harvest.collect([root], query_slurm=False)
    assert len(result.baseline) == 1  # the broken one is skipped
    cell = result.cells[0]
    step = statistics.median(r.step_time_s for r in cell.runs)
    gradient_s = 2_000_000 / 0.03 / 1e9
    assert cell.allreduce_s == pytest.approx(gradient_s)
    assert cell.allreduce_share == pytest.approx(gradient_s / step)
    # Bytes over the summed all-reduce time against the probe at the same message size; not
    # the gradient's probe time over DDP's window (0.0667 / 0.2 would read 33%).
    assert cell.bandwidth_reached == pytest.approx(0.01 / 0.02)
    assert cell.exposed_share == pytest.approx(0.05 / step)
    text = harvest.render(result, "table")
    assert "Network baseline" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("gloo ")]
    assert [r[3:5] for r in rows] == [["488.3", "KiB"], ["1.9", "MiB"]]  # every size, ascending
    assert rows[1][5] == "gradient" and "drift" not in text  # no end probe: no drift column
    data = json.loads(harvest.render(result, "json"))
    assert data["baseline"][0]["busbw_GBps"] == 0.03 and data["baseline"][0]["when"] == "start"
    assert data["cells"][0]["bandwidth_reached"] == pytest.approx(0.5)


def test_a_probe_outside_trainings_message_size_gives_no_bandwidth_reached(tmp_path):
    root = _campaign(tmp_path, {("distributed-ps", 2): [1800.0, 1820.0]}, communication="gloo")
    # 25 MiB buckets, a sweep capped at 4 MiB (HPCDP_ALLREDUCE_MAX_MB): no extrapolation.
    _with_comm(root, "distributed-ps-2n/repeat-*/metrics.jsonl", allreduce_s=0.2,
               allreduce_bytes=50 << 20, allreduce_calls=2)
    _probe(root / "baseline" / "distributed-ps-2n", {1 << 20: 0.5, 2_000_000: 0.6,
                                                     4 << 20: 0.7})
    cell = harvest.collect([root], query_slurm=False).cells[0]
    assert cell.allreduce_s is not None and cell.bandwidth_reached is None


def test_probes_are_tagged_by_campaign_and_time_and_show_their_drift(tmp_path):
    a = _campaign(tmp_path, {("distributed-ps", 2): [1800.0, 1820.0]}, name="a",
                  communication="gloo")
    b = _campaign(tmp_path, {("distributed-ps", 2): [1700.0, 1710.0]}, name="b",
                  communication="gloo")
    _probe(a / "baseline" / "distributed-ps-2n", {1 << 20: 0.5, 2_000_000: 0.6})
    _probe(a / "baseline-end" / "distributed-ps-2n", {1 << 20: 0.4, 2_000_000: 0.66})
    _probe(b / "baseline" / "distributed-ps-2n", {1 << 20: 0.1, 2_000_000: 0.2})
    found = read.find_baselines([tmp_path])
    tags = sorted((Path(p["campaign"]).name, p["when"]) for p in found)
    assert tags == [("a", "end"), ("a", "start"), ("b", "start")]
    assert all(p["campaign"] == str(Path(p["path"]).parents[2]) for p in found)
    result = harvest.collect([tmp_path], query_slurm=False)
    cells = {c.source: c for c in result.cells}
    # Each campaign's cells are explained by its own start probe, never the other's.
    assert cells[str(a)].allreduce_s == pytest.approx(2_000_000 / 0.6 / 1e9)
    assert cells[str(b)].allreduce_s == pytest.approx(2_000_000 / 0.2 / 1e9)
    text = repeats.render_baseline(result.baseline)
    assert "drift: end of the campaign against its start" in text
    assert f"{a}:" in text and f"{b}:" in text  # two campaigns: each under its own name
    lines = text.splitlines()
    a_rows = lines[lines.index(f"{a}:") + 3:lines.index(f"{b}:") - 1]
    assert [row.split()[-2:] for row in a_rows] == [["0.400", "-20.0%"], ["0.660", "+10.0%"]]
    b_rows = lines[lines.index(f"{b}:") + 3:]
    assert [row.split()[-2:] for row in b_rows] == [["-", "-"], ["-", "-"]]  # no end probe
    assert "| drift |" in repeats.render_baseline(result.baseline, markdown=True)


def test_unmeasured_communication_shows_a_dash_and_none_a_true_zero(tmp_path):
    root = _campaign(tmp_path, {("single-gpu", 1): [1000.0, 1010.0],
                                ("single-ps", 1): [1000.0, 1005.0]})
    _with_comm(root, "single-gpu-1n/repeat-*/metrics.jsonl", exposed_comm_s=0.0)
    _with_comm(root, "single-ps-1n/repeat-*/metrics.jsonl", exposed_comm_s=None)
    result = harvest.collect([root], query_slurm=False)
    cells = {c.strategy: c for c in result.cells}
    assert cells["single-gpu"].exposed_share == 0.0 and cells["single-ps"].exposed_share is None
    lines = harvest.render(result, "table").splitlines()
    titles = re.split(r"\s{2,}", next(line for line in lines if line.startswith("cell ")))
    rows = {row[0]: dict(zip(titles, row)) for row in (re.split(r"\s{2,}", line)
            for line in lines if line.startswith(("single-gpu 1n", "single-ps 1n")))}
    assert rows["single-gpu 1n"]["exposed comm"] == "0%"
    assert rows["single-ps 1n"]["exposed comm"] == "-"  # not measured: not "0%"


def test_tokens_per_elapsed_second_counts_everything_between_the_steps(tmp_path):
    # Segment 1 trains steps 1-4 (4 s of steps) and is killed after logging step 4 at 6 s;
    # segment 2 resumes from a step-2 checkpoint, redoes 3-4, trains 5-6, and its summary says
    # its loop took 9 s from its first step's start. 6 steps x 1000 tokens over 6 + 9 s.
    recs = [header("distributed-ps", 1, 2, steps=6),
            step(1, 5.0, 1000, 1.5), step(2, 4.9, 1000, 3), step(3, 4.8, 1000, 4.5),
            step(4, 4.7, 1000, 6),
            header("distributed-ps", 1, 2, start_step=2, steps=6),
            step(3, 4.8, 1000, 2), step(4, 4.7, 1000, 3), step(5, 4.6, 1000, 4),
            step(6, 4.5, 1000, 5),
            {**summary(6, 4.5), "tokens_trained": 4000, "train_elapsed_s": 9.0,
             "tokens_per_elapsed_s": 4000 / 9.0}]
    r = run_one(write_run(tmp_path / "rq", recs))
    assert r.tokens_per_s == 1000.0  # per step-second: the steady steps alone
    assert r.tokens_per_elapsed_s == pytest.approx(6000 / 15.0)
    table = harvest.render(harvest.collect([tmp_path / "rq"], query_slurm=False), "table")
    header_line, row = table.splitlines()[:2]
    assert "tokens/elapsed s" in header_line
    column = header_line.index("tokens/elapsed s") + len("tokens/elapsed s")
    assert row[:column].rstrip().endswith("400")
    rows = list(csv.DictReader(io.StringIO(harvest.render(
        harvest.collect([tmp_path / "rq"], query_slurm=False), "csv"))))
    assert float(rows[0]["tokens_per_elapsed_s"]) == pytest.approx(400.0)
    # A file from before the field: the summary's absence is the last step's elapsed_s.
    old = [r for r in recs if r["kind"] != "summary"] + [summary(6, 4.5)]
    assert run_one(write_run(tmp_path / "old", old)).tokens_per_elapsed_s == pytest.approx(
        6000 / (6 + 5))


def test_the_step_lines_comm_fields_read_alike_by_pattern_and_by_json(tmp_path):
    # The writer's key order (train/loop.py Throughput.record), matched by the fast pattern,
    # and the same record in another order, read by json.loads: the same columns.
    record = {"kind": "step", "time": T0 + 1, "step": 3, "loss": 4.0, "lr": 1e-3,
              "grad_norm": 1.0, "loss_scale": None, "skipped": False,
              "phases_s": {"data": 0.0, "forward": 0.1, "backward": 0.2, "sync": 0.0,
                           "optimizer": 0.05},
              "rank_work_s": {"ranks": 2, "mean": 0.39, "sd": 0.01, "min": 0.38, "max": 0.4,
                              "slowest": 1},
              "ddp_comm_s": {"allreduce": 0.02, "exposed": 0.01, "window": 0.1},
              "exposed_comm_s": 0.01, "allreduce_s": 0.02, "allreduce_bytes": 1783808,
              "allreduce_calls": 2, "step_time_s": 0.4, "tokens_per_s": 2500.0,
              "tokens_seen": 3000, "elapsed_s": 1.2, "max_mem_gb": None, "mfu": None}
    line = json.dumps(record)
    assert read._STEP_LINE.fullmatch(line) is not None
    fast = write_run(tmp_path / "fast", [header("distributed-ps", 1, 2), record])
    slow = write_run(tmp_path / "slow", [header("distributed-ps", 1, 2),
                                         dict(reversed(list(record.items())))])
    a, b = (read.read_metrics(p / "metrics.jsonl").columns for p in (fast, slow))
    assert (a.allreduce_bytes, a.allreduce_calls, a.allreduce_s, a.exposed_comm_s) == (
        [1783808.0], [2.0], [0.02], [0.01])
    assert (b.allreduce_bytes, b.allreduce_calls, b.allreduce_s, b.exposed_comm_s) == (
        a.allreduce_bytes, a.allreduce_calls, a.allreduce_s, a.exposed_comm_s)
    # A field between the pattern's optional ones (rank_work_s was once written after
    # exposed_comm_s): the pattern still matches by skipping them, so the line takes the slow
    # path rather than losing them
    moved = {k: v for k, v in record.items() if k != "rank_work_s"}
    moved = dict(list(moved.items())[:11] + [("rank_work_s", record["rank_work_s"])]
                 + list(moved.items())[11:])
    assert list(moved)[10:13] == ["exposed_comm_s", "rank_work_s", "allreduce_s"]
    c = read.read_metrics(write_run(tmp_path / "moved", [header("distributed-ps", 1, 2),
                                                         moved]) / "metrics.jsonl").columns
    assert (c.allreduce_bytes, c.allreduce_calls, c.allreduce_s, c.exposed_comm_s) == (
        a.allreduce_bytes, a.allreduce_calls, a.allreduce_s, a.exposed_comm_s)


# --------------------------------------------------------------------------- populations (issue 18)


def test_campaigns_old_campaigns_and_separate_jobs_are_shown_apart_never_pooled(tmp_path):
    tokens = {("single-gpu", 1): [1000.0, 1001.0], ("distributed-ps", 1): [1500.0, 1501.0]}
    now = _campaign(tmp_path, tokens)
    old = _campaign(tmp_path, {("single-gpu", 1): [500.0, 501.0]},
                    name="compare.old-20261201-120000", record={"exclusive": False})
    simple_run(tmp_path / "single-gpu-1n", "single-gpu", 1, 1, 300.0)  # hpcdp submit
    result = harvest.collect([tmp_path], query_slurm=False)
    sources = {c.name: set() for c in result.cells}
    for c in result.cells:
        sources[c.name].add(c.source)
        assert len({r.source for r in c.runs}) == 1  # one population per cell
    assert sources["single-gpu 1n"] == {str(now), str(old), ""}
    pooled = {c.source: len(c.runs) for c in result.cells if c.name == "single-gpu 1n"}
    assert pooled == {str(now): 2, str(old): 2, "": 1}
    text = harvest.render(result, "table")
    assert "3 sources here, each shown and judged on its own" in text
    assert f"Source: campaign {old} (nodes NOT exclusive" in text
    assert "Source: separate jobs (hpcdp submit, sbatch)" in text
    # the per-run speed-up of the campaign's DDP is against its own campaign's single-gpu
    runs = {r.run_dir: r for r in result.runs}
    ddp = runs[str(now / "distributed-ps-1n" / "repeat-1")]
    assert ddp.speedup == pytest.approx(1500.0 / 1000.0)
    assert ddp.baseline.endswith("single-gpu-1n/repeat-1") and "old" not in ddp.baseline


def test_cells_that_differ_in_allocator_get_no_verdict_across_them(tmp_path):
    root = _campaign(tmp_path, {("distributed-ps", 2): [2000.0, 2010.0, 2005.0, 2015.0, 1995.0]},
                     malloc="tcmalloc")
    for k, tps in enumerate([1500.0, 1490.0, 1510.0, 1495.0, 1505.0], start=1):
        simple_run(root / "horovod-2n" / f"repeat-{k}", "horovod", 2, 2, tps, malloc="system")
    result = harvest.collect([root], query_slurm=False)
    outcomes = [v["outcome"] for v in result.verdicts]
    assert outcomes.count("refused") == 1 and "faster" not in outcomes
    refusal = next(v for v in result.verdicts if v["outcome"] == "refused")
    assert "different conditions" in refusal["text"]
    assert "malloc tcmalloc" in refusal["text"] and "malloc system" in refusal["text"]
    # each allocator's cell stands alone: no verdict compares them
    assert sorted(v["outcome"] for v in result.verdicts) == ["alone", "alone", "refused"]


def test_cells_inside_and_outside_a_container_get_no_verdict_across_them(tmp_path):
    # The same allocator and threads, but one cell ran in an image (its own torch and
    # libraries): a ratio across them would measure the image, not the strategy.
    root = _campaign(tmp_path, {("distributed-ps", 2): [2000.0, 2010.0, 2005.0, 2015.0, 1995.0]},
                     malloc="system")
    for k, tps in enumerate([1500.0, 1490.0, 1510.0, 1495.0, 1505.0], start=1):
        simple_run(root / "horovod-2n" / f"repeat-{k}", "horovod", 2, 2, tps, malloc="system",
                   container="oci /images/pytorch")
    result = harvest.collect([root], query_slurm=False)
    refusal = next(v for v in result.verdicts if v["outcome"] == "refused")
    assert "horovod 2n: malloc system, ? thread(s), ? CPU(s) per process, in container " \
           "oci /images/pytorch" in refusal["text"]
    assert "distributed-ps 2n: malloc system, ? thread(s), ? CPU(s) per process;" \
           in refusal["text"]
    assert sorted(v["outcome"] for v in result.verdicts) == ["alone", "alone", "refused"]
    cells = {c["cell"]: c for c in json.loads(harvest.render(result, "json"))["cells"]}
    assert cells["horovod 2n"]["conditions"]["container"] == "oci /images/pytorch"
    assert cells["distributed-ps 2n"]["conditions"]["container"] is None


def _set_memory(run_dir: Path, peak_gb: float, state_gb: float = 4.0) -> None:
    """Give a HAND-WRITTEN run's summary the memory record train/memory.py writes."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    recs[-1]["memory"] = {"measured": "cuda_max_allocated", "peak_bytes": peak_gb * 1e9,
                          "params_bytes": state_gb / 4 * 1e9, "grads_bytes": state_gb / 4 * 1e9,
                          "optimizer_bytes": state_gb / 2 * 1e9}
    write_run(run_dir, recs)


def test_the_verdict_names_a_cell_that_trades_throughput_for_memory(tmp_path):
    root = _campaign(tmp_path, {("distributed-ps", 2): [2000.0, 2010.0, 2005.0, 2015.0, 1995.0],
                                ("horovod", 2): [1860.0, 1870.0, 1865.0, 1875.0, 1855.0],
                                ("single-ps", 1): [900.0, 910.0, 905.0, 915.0, 895.0]})
    for k in range(1, 6):
        _set_memory(root / "distributed-ps-2n" / f"repeat-{k}", 10.0)
        _set_memory(root / "horovod-2n" / f"repeat-{k}", 5.5)   # the sharded-like one
        _set_memory(root / "single-ps-1n" / f"repeat-{k}", 12.0)  # alone on 1 node
    result = json.loads(harvest.render(harvest.collect([root], query_slurm=False), "json"))
    cells = {c["cell"]: c for c in result["cells"]}
    assert cells["horovod 2n"]["memory_per_rank_gb"] == 5.5
    two = next(v for v in result["verdict"] if v["nodes"] == 2)
    assert two["fastest"] == "distributed-ps 2n"
    assert two["memory_trades"] == [
        "horovod 2n: 0.55x distributed-ps 2n's memory per rank (state 1.00x) at 0.93x its "
        "throughput (0.92x-0.94x)"]
    assert two["text"].endswith("; memory: " + two["memory_trades"][0])
    one = next(v for v in result["verdict"] if v["nodes"] == 1)
    assert one["memory_trades"] == [] and "memory" not in one["text"]
    # More memory than the leader and slower is no trade: not named.
    for k in range(1, 6):
        _set_memory(root / "horovod-2n" / f"repeat-{k}", 11.0)
    again = harvest.collect([root], query_slurm=False)
    assert next(v for v in again.verdicts if v["nodes"] == 2)["memory_trades"] == []
    assert "mem/rank GB" in harvest.render(again, "table")


def test_a_sharded_cell_states_its_trade_against_the_strategy_it_shards(tmp_path):
    """fsdp and zero1 are held to DDP (what they shard: the registry's shards_state_of), not
    to the throughput leader (horovod here); state/rank is in the table beside mem/rank."""
    root = _campaign(tmp_path, {("horovod", 2): [2100.0, 2110.0, 2105.0, 2115.0, 2095.0],
                                ("distributed-ps", 2): [2000.0, 2010.0, 2005.0, 2015.0, 1995.0],
                                ("fsdp", 2): [1860.0, 1870.0, 1865.0, 1875.0, 1855.0],
                                ("zero1", 2): [1900.0, 1910.0, 1905.0, 1915.0, 1895.0]})
    memory = {"horovod": (10.0, 4.0), "distributed-ps": (10.0, 4.0), "fsdp": (5.5, 2.0),
              "zero1": (7.5, 3.0)}
    for strategy, (peak, state) in memory.items():
        for k in range(1, 6):
            _set_memory(root / f"{strategy}-2n" / f"repeat-{k}", peak, state)
    result = harvest.collect([root], query_slurm=False)
    (verdict,) = result.verdicts
    assert verdict["fastest"] == "horovod 2n"
    assert sorted(verdict["memory_trades"]) == [
        "fsdp 2n: 0.55x distributed-ps 2n's memory per rank (state 0.50x) at 0.93x its "
        "throughput (0.92x-0.94x)",
        "zero1 2n: 0.75x distributed-ps 2n's memory per rank (state 0.75x) at 0.95x its "
        "throughput (0.94x-0.96x)"]
    table = harvest.render(result, "table")
    assert "state/rank GB" in table
    fsdp_row = next(line for line in table.splitlines() if line.startswith("fsdp 2n"))
    assert " 5.50 " in fsdp_row and " 2.00 " in fsdp_row, fsdp_row


def _ddp_and_a_drifting_horovod(tmp_path, horovod_tps: list[float]) -> Path:
    """A campaign of DDP on 2 nodes and a Horovod cell whose fp16 gradients drift its loss."""
    root = _campaign(tmp_path, {("distributed-ps", 2): [1000.0, 1001.0, 1002.0, 1003.0]},
                     communication="gloo", global_batch=16)
    for k, tps in enumerate(horovod_tps, start=1):
        simple_run(root / "horovod-2n" / f"repeat-{k}", "horovod", 2, 2, tps,
                   communication="horovod-mpi", global_batch=16, grad_comm="fp16",
                   losses=(4.0, 3.5, 3.0, 2.7, 2.2))
    return root


def test_a_cell_whose_loss_drifted_cannot_win(tmp_path):
    root = _ddp_and_a_drifting_horovod(tmp_path, [2000.0, 2001.0, 2002.0, 2003.0])
    result = harvest.collect([root], query_slurm=False)
    (v,) = result.verdicts
    assert v["fastest"] == "distributed-ps 2n" and v["outcome"] != "faster"
    assert "horovod 2n may not win: its loss drifts 10.0%" in v["text"]


def test_a_campaign_cell_counts_its_own_restarts_not_the_campaigns(tmp_path):
    # issue 19, item 4: the campaign job was requeued once; the cell that ran after the
    # requeue has one segment whose header says restart_count 1 (the job's), the cell that
    # was interrupted has two segments.
    root = tmp_path / "compare"
    (root / "campaign.json").parent.mkdir(parents=True)
    (root / "campaign.json").write_text("{}")
    after = [header("single-gpu", 1, 1, job="9", restart_count=1, steps=3),
             step(1, 4.0, 1000, 1), step(2, 3.5, 1000, 2), step(3, 3.0, 1000, 3),
             summary(3, 3.0)]
    write_run(root / "single-gpu-1n" / "repeat-1", after)
    interrupted = [header("single-gpu", 1, 1, job="9", restart_count=0, steps=3),
                   step(1, 4.0, 1000, 1),
                   header("single-gpu", 1, 1, job="9", restart_count=1, start_step=1, steps=3),
                   step(2, 3.5, 1000, 2), step(3, 3.0, 1000, 3), summary(3, 3.0)]
    write_run(root / "single-gpu-1n" / "repeat-2", interrupted)
    runs = {Path(r.run_dir).name: r for r in harvest.harvest([root], query_slurm=False)}
    assert runs["repeat-1"].restarts == 0 and runs["repeat-2"].restarts == 1
    assert not any("requeued" in n for n in runs["repeat-1"].notes)
    assert "requeued/resumed 1x (2 segments)" in runs["repeat-2"].notes


def test_a_failed_attempt_that_was_retried_is_counted_as_failed_not_as_a_repeat(tmp_path):
    root = _campaign(tmp_path, {("single-gpu", 1): [1000.0, 1001.0]})
    attempt = [header("single-gpu", 1, 1, steps=5), step(1, 4.0, 100, 1)]  # died at step 1
    write_run(root / "single-gpu-1n" / "repeat-2.failed", attempt)
    result = harvest.collect([root], query_slurm=False, now=T0 + 10_000)
    (cell,) = result.cells
    assert (len(cell.runs), cell.failed) == (2, 1)
    failed = next(r for r in result.runs if r.run_dir.endswith("repeat-2.failed"))
    assert "failed attempt, retried as repeat-2; not a repeat" in failed.notes
    assert "2 (1 failed)" in harvest.render(result, "table")


def test_a_sharded_cell_is_held_to_its_strategy_in_the_same_precision(tmp_path):
    """issue 36, item 10: fsdp bf16 against DDP bf16 (state 1.9 against 2.0 GB: no trade), fsdp
    fp32 against DDP fp32 (not against whichever DDP cell came last)."""
    root = _campaign(tmp_path, {("distributed-ps", 2): [2000.0, 2010.0, 2005.0, 2015.0, 1995.0],
                                ("fsdp", 2): [1860.0, 1870.0, 1865.0, 1875.0, 1855.0]})
    for strategy in ("distributed-ps", "fsdp"):
        for k, tps in enumerate([2100.0, 2110.0, 2105.0, 2115.0, 2095.0], start=1):
            simple_run(root / f"{strategy}-bf16-2n" / f"repeat-{k}", strategy, 2, 2, tps,
                       precision="bf16")
    memory = {"distributed-ps-2n": (10.0, 4.0), "fsdp-2n": (5.5, 2.0),
              "distributed-ps-bf16-2n": (6.0, 2.0), "fsdp-bf16-2n": (5.7, 1.9)}
    for folder, (peak, state) in memory.items():
        for k in range(1, 6):
            _set_memory(root / folder / f"repeat-{k}", peak, state)
    (verdict,) = harvest.collect([root], query_slurm=False).verdicts
    assert verdict["memory_trades"] == [
        "fsdp 2n: 0.55x distributed-ps 2n's memory per rank (state 0.50x) at 0.93x its "
        "throughput (0.92x-0.94x)"]


def test_a_cell_that_failed_loss_parity_is_offered_as_no_trade(tmp_path):
    root = _ddp_and_a_drifting_horovod(tmp_path, [900.0, 901.0, 902.0, 903.0])
    for k in range(1, 5):
        _set_memory(root / "distributed-ps-2n" / f"repeat-{k}", 10.0)
        _set_memory(root / "horovod-2n" / f"repeat-{k}", 5.0)
    (v,) = harvest.collect([root], query_slurm=False).verdicts
    assert "horovod 2n may not win" in v["text"]
    assert v["memory_trades"] == [] and "memory:" not in v["text"]


def _wide_campaign(tmp_path: Path) -> Path:
    """Six strategies of five repeats, a repeat-1 that never finished and a cell whose loss
    drifts: long notes, a long verdict, every column filled somewhere."""
    root = _campaign(tmp_path, {
        (s, n): [1000.0 * n * (1 + 0.05 * i) + 7.0 * k for k in range(5)]
        for i, s in enumerate(["single-gpu", "single-ps", "distributed-ps", "horovod",
                               "distributed-ps-apex", "horovod-apex"])
        for n in ([1] if s.startswith("single") else [1, 2])})
    write_run(root / "horovod-2n" / "repeat-1",
              [header("horovod", 2, 2, steps=5), step(1, 4.0, 100, 1)])  # died at step 1
    for k in range(1, 6):
        simple_run(root / "horovod-apex-2n" / f"repeat-{k}", "horovod-apex", 2, 2, 2600.0 + k,
                   losses=(4.0, 3.5, 3.0, 2.7, 2.2))
    return root


def test_the_output_fits_100_columns_and_wide_keeps_every_column(tmp_path, capsys,
                                                                 monkeypatch):
    """issue 36, item 12: `COLUMNS=100 hpcdp harvest` printed lines of up to 443 characters."""
    root = _wide_campaign(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    assert harvest.main(_args(str(root), "--no-slurm")) == 0
    narrow = capsys.readouterr().out
    assert max(map(len, narrow.splitlines())) <= 100
    assert "more column(s) left out to fit 100 characters: --wide prints them" in narrow
    assert "could not tell apart from" in narrow or "is fastest" in narrow
    assert "horovod-apex 2n may not win: its loss drifts" in narrow.replace("\n  ", " ")
    out = tmp_path / "out"
    assert harvest.main(_args(str(root), "--no-slurm", "--wide", "--out", str(out),
                              "--no-plots")) == 0
    wide = capsys.readouterr().out
    assert max(map(len, wide.splitlines())) > 100
    titles = [title for _, title in harvest.table.COLUMNS if title != "experiment"]
    for text in (wide.splitlines()[0], (out / "table.md").read_text().splitlines()[0]):
        assert all(title in text for title in titles), text
    assert all(title in (out / "table.md").read_text() for title in repeats.COLUMNS)


def test_repeats_are_numbered_not_a_repeat_of_one_another(tmp_path):
    """repeat-1 did not finish, so the run compared against is repeat-2; before, repeat-1 read
    "repeat of horovod-2n/repeat-2"."""
    runs = harvest.harvest([_wide_campaign(tmp_path)], query_slurm=False, now=T0 + 10_000)
    horovod = {Path(r.run_dir).name: r.notes for r in runs
               if r.run_dir.endswith(tuple(f"horovod-2n/repeat-{k}" for k in range(1, 6)))}
    assert horovod["repeat-1"][-1] == "repeat 1 of 5" and horovod["repeat-3"] == ["repeat 3 of 5"]
    assert not any("repeat of" in note for r in runs for note in r.notes)
