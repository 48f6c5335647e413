"""hpcdp/progress.py: step of total, loss, tokens/s and ETA from a run's metrics.jsonl, read from
its first and last bytes only; a campaign's progress is the cell it is on. And the frame of
`hpcdp status` that shows it (what --watch redraws)."""

from __future__ import annotations

import json
from pathlib import Path

from hpcdp import cli, progress, run_folder, slurm


def header(steps: int, start: int = 0) -> dict:
    return {"kind": "header", "start_step": start, "config": {"train": {"steps": steps}}}


def step(n: int, elapsed: float, loss: float = 2.0) -> dict:
    return {"kind": "step", "step": n, "loss": loss, "tokens_per_s": 1000.0, "elapsed_s": elapsed,
            "phases_s": {"forward": 0.01}}


def write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_step_loss_rate_and_eta_from_the_last_records(tmp_path):
    # Logged every 10 steps, 0.5 s per step: 300 - 120 = 180 steps left -> 90 s.
    records = [header(300)] + [step(n, n * 0.5, loss=3.0 - n / 1000) for n in range(10, 130, 10)]
    got = progress.of_metrics(write(tmp_path / "metrics.jsonl", records))
    assert (got.step, got.total_steps) == (120, 300)
    assert got.loss == 3.0 - 0.12 and got.tokens_per_s == 1000.0
    assert abs(got.eta_s - 90.0) < 1e-9
    assert got.line() == "120/300 loss 2.880 1,000 tok/s ETA 1m30s"


def test_a_resumed_run_takes_the_last_header_and_a_cut_line_is_skipped(tmp_path):
    records = [header(20), step(10, 5.0), header(40, start=10), step(20, 1.0), step(30, 2.0)]
    got = progress.of_metrics(write(tmp_path / "m.jsonl", records, tail='{"kind": "step", "st'))
    assert (got.step, got.total_steps) == (30, 40)
    assert abs(got.eta_s - 1.0) < 1e-9  # 10 steps left at 0.1 s


def test_only_the_tail_of_a_long_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(run_folder, "TAIL_BYTES", 4096)
    records = [header(100_000)] + [step(n, n * 0.01) for n in range(1, 20_000)]
    path = write(tmp_path / "m.jsonl", records)
    assert path.stat().st_size > 100 * 4096
    got = progress.of_metrics(path)
    assert (got.step, got.total_steps) == (19_999, 100_000)  # header from the first line


def test_a_finished_run_has_no_time_left_and_no_file_no_progress(tmp_path):
    records = [header(20), step(10, 1.0), step(20, 2.0), {"kind": "summary", "steps": 20}]
    got = progress.of_metrics(write(tmp_path / "m.jsonl", records))
    assert (got.step, got.eta_s) == (20, None)  # ended: no "ETA 0s"
    assert got.line() == "20/20 loss 2.000 1,000 tok/s"
    assert progress.of_metrics(tmp_path / "missing.jsonl") is None
    assert progress.of_metrics(write(tmp_path / "empty.jsonl", [])) is None
    started = progress.of_metrics(write(tmp_path / "h.jsonl", [header(50, start=10)]))
    assert (started.step, started.total_steps, started.eta_s) == (10, 50, None)
    assert started.line() == "10/50"


def test_a_campaign_shows_the_first_cell_not_done(tmp_path):
    cells = [{"key": f"c{i}", "run_dir": str(tmp_path / f"c{i}")} for i in range(3)]
    (tmp_path / "campaign.json").write_text(json.dumps({"cells": cells}))
    (tmp_path / "cells.done").write_text("cell c0 0\n")
    write(tmp_path / "c1" / "metrics.jsonl", [header(30), step(10, 1.0), step(20, 2.0)])
    got = progress.of_run_dir(tmp_path)
    assert got.cell == "2/3 c1" and (got.step, got.total_steps) == (20, 30)
    assert got.line().startswith("cell 2/3 c1: 20/30")
    (tmp_path / "cells.done").write_text("cell c0 0\ncell c1 0\n")
    assert progress.of_run_dir(tmp_path).line() == "cell 3/3 c2: starting"  # no record yet
    (tmp_path / "cells.done").write_text("cell c0 0\ncell c1 0\ncell c2 0\n")
    assert progress.of_run_dir(tmp_path).line() == "all 3 cells done"
    (tmp_path / "cells.done").write_text("failed c0 1\ncell c1 0\ncell c2 1\ncell c0 0\n")
    assert progress.of_run_dir(tmp_path).line() == "all 3 cells done, 1 failed"  # c0's retry won


def test_a_campaign_counts_its_probes_as_its_log_does_and_skips_a_failed_attempt(tmp_path):
    # issue 19, item 12: x/6 where the log said x/7; a failed first attempt is behind us
    entry = lambda key: {"key": key, "run_dir": str(tmp_path / key)}  # noqa: E731
    record = {"baseline": [entry("baseline-ddp-2n")], "cells": [entry("a"), entry("b")],
              "baseline_end": [entry("baseline-end-ddp-2n")]}
    (tmp_path / "campaign.json").write_text(json.dumps(record))
    (tmp_path / "cells.done").write_text("cell baseline-ddp-2n 0\nfailed a 1\n")
    assert progress.of_run_dir(tmp_path).cell == "3/4 b"
    (tmp_path / "cells.done").write_text("")
    assert progress.of_run_dir(tmp_path).line() == "cell 1/4 baseline-ddp-2n: network probe"


def test_a_campaign_moved_aside_by_fresh_is_read_where_it_went(tmp_path):
    old, new = tmp_path / "compare.old-20261202-010000", tmp_path / "compare"
    for folder, job, done in ((old, "11", "cell c0 0\n"), (new, "22", "")):
        cells = [{"key": f"c{i}", "run_dir": str(folder / f"c{i}")} for i in range(2)]
        folder.mkdir()
        (folder / "campaign.json").write_text(json.dumps({"cells": cells}))
        (folder / "cells.done").write_text(done)
        (folder / "submission.json").write_text(json.dumps({"job_id": job}))
    assert progress.of_run_dir(new, "11").cell == "2/2 c1"  # the old job's own campaign
    assert progress.of_run_dir(new, "22").cell == "1/2 c0"
    assert progress.of_run_dir(new, "33") is None  # neither: say nothing rather than misread


def test_durations_read_like_a_clock():
    assert [progress.format_duration(s) for s in (0, 59.6, 61, 3600, 7322)] == [
        "0s", "1m00s", "1m01s", "1h00m", "2h02m"]


def test_every_status_frame_carries_the_count_of_other_checkouts_jobs(tmp_path):
    # issue 19, item 12: --watch on a terminal printed the count once, before its first redraw
    # cleared it; the count now is part of each frame. With --json it is a note on stderr.
    run_dir = tmp_path / "run"
    write(run_dir / "metrics.jsonl", [header(30), step(10, 1.0), step(20, 2.0)])
    records = [{"job_id": "7", "strategy": "ddp", "nodes": 2, "run_dir": str(run_dir)}]
    infos = slurm.JobTable({"7": slurm.JobInfo("7", "RUNNING", elapsed_s=12.0,
                                                source="squeue")})
    frame, notes = cli._status_frame(records, infos, as_json=False, others=2)
    first, table, row, done = frame.splitlines()
    assert first == "(2 job(s) of other checkouts not shown: --all-projects shows them)"
    assert table.split()[:2] == ["JOB", "STATE"] and row.split()[:3] == ["7", "RUNNING", "ddp"]
    assert done.strip().startswith("20/30 loss 2.000") and notes == []
    frame, notes = cli._status_frame(records, infos, as_json=True, others=2)
    assert json.loads(frame)[0]["progress"]["step"] == 20  # stdout stays JSON
    assert notes == ["(2 job(s) of other checkouts not shown: --all-projects shows them)"]
    alone, _ = cli._status_frame(records, infos, as_json=False)
    assert "other checkouts" not in alone and alone.split()[:2] == ["JOB", "STATE"]
