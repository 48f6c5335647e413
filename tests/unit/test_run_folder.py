"""hpcdp/run_folder.py: the one reader of metrics.jsonl that status, harvest, resume, the
forecast, trackers and export read through (issue 47: it had seven private parsers)."""

from __future__ import annotations

import json

from hpcdp import run_folder


def _write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_cut_and_glued_lines_are_read_as_harvest_reads_them(tmp_path):
    header = {"kind": "header", "world_size": 2, "start_step": 0}
    steps = [{"kind": "step", "step": n, "loss": 5.0 - n} for n in (1, 2, 3)]
    lines = [json.dumps(header), json.dumps(steps[0]),
             '{"kind": "step", "st' + json.dumps(steps[1]),  # a kill cut it, the rerun wrote on
             "not json", json.dumps([1, 2]), json.dumps({"no": "kind"}), json.dumps(steps[2])]
    (tmp_path / run_folder.METRICS_FILE).write_text("\n".join(lines) + '\n{"kind": "summ')
    assert run_folder.read_metrics(tmp_path) == [header, *steps]
    assert run_folder.read_metrics(tmp_path, ("header",)) == [header]
    assert run_folder.read_metrics(tmp_path / run_folder.METRICS_FILE, ("step",)) == steps
    assert run_folder.read_metrics(tmp_path / "nowhere") == []


def test_head_and_tail_reads_the_first_line_and_the_end_only(tmp_path, monkeypatch):
    monkeypatch.setattr(run_folder, "TAIL_BYTES", 2048)
    header = {"kind": "header", "world_size": 1}
    records = [header] + [{"kind": "step", "step": n, "pad": "x" * 100} for n in range(1, 500)]
    path = _write(tmp_path / "m.jsonl", records + [{"kind": "summary", "steps": 499}])
    head, tail = run_folder.head_and_tail(path)
    assert head == header
    assert tail[-1] == {"kind": "summary", "steps": 499} and 10 < len(tail) < 30
    assert tail[0]["step"] > 400  # the line the tail cut into is skipped, not misread
    assert run_folder.head_and_tail(tmp_path / "missing.jsonl") == (None, [])
