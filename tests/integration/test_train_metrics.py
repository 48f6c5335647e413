"""metrics.jsonl and the stdout line of a real run, checked against docs/metrics.md.

The field lists are parsed from the table in docs/metrics.md, so the document and the code cannot
drift apart. One run (single process, synthetic tokens: the text does not matter here) feeds all
the checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
STEPS = 10
# docs/architecture.md: `step 10/30 | loss 3.4512 | lr 2.1e-03 | 51234 tok/s | 12.3 ms |
# strategy distributed-ps | world 2`
LINE = re.compile(r"step (\d+)/(\d+) \| loss (\d+\.\d{4}) \| lr (\d\.\de[-+]\d\d) \| "
                  r"(\d+) tok/s \| (\d+\.\d) ms \| strategy ([\w-]+) \| world (\d+)")


def documented_fields() -> dict[str, list[str]]:
    fields = {}
    for line in DOC.read_text().splitlines():
        match = re.fullmatch(r"\| `(\w+)` \| (.+) \|", line.strip())
        if match:
            fields[match.group(1)] = re.findall(r"`(\w+)`", match.group(2))
    assert set(fields) == {"header", "step", "eval", "checkpoint", "summary"}, fields
    return fields


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("metrics")
    sets = [f"train.steps={STEPS}", "train.log_interval=3", "train.eval_interval=5",
            "train.checkpoint_interval=4", "train.warmup_steps=4", "train.lr=1.0e-3",
            "train.min_lr=1.0e-4", "data.corpus=synthetic", "train.micro_batch_size=2",
            "train.grad_accum_steps=2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="3",
               PYTHONPATH=str(ROOT))
    env.pop("HPCDP_PEAK_FLOPS", None)
    done = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--out", str(out), *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def test_every_record_has_exactly_the_documented_fields(run: tuple[Path, str]) -> None:
    out, _ = run
    fields = documented_fields()
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in recs][0] == "header" and recs[-1]["kind"] == "summary"
    for record in recs:
        assert isinstance(record["time"], float)
        assert set(record) - {"kind", "time"} == set(fields[record["kind"]]), record["kind"]
    kinds = [r["kind"] for r in recs]
    assert kinds.count("header") == 1 and kinds.count("summary") == 1


def test_records_hold_what_the_run_did(run: tuple[Path, str]) -> None:
    out, _ = run
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_kind: dict[str, list[dict]] = {}
    for r in recs:
        by_kind.setdefault(r["kind"], []).append(r)
    (header,) = by_kind["header"]
    assert header["strategy"] == "single-gpu" and header["mechanism"] == "single"
    assert header["precision"] == "fp32" and header["amp_backend"] is None
    assert header["world_size"] == 1 and header["devices_per_process"] == 1
    assert header["global_batch_size"] == 4 and header["tokens_per_step"] == 4 * 128
    assert header["slurm_job_id"] == "4242" and header["restart_count"] == 3
    assert header["start_step"] == 0 and header["resumed_from"] is None
    assert header["config"]["train"]["steps"] == STEPS and header["experiment"] == "smoke"
    assert header["versions"]["torch"]
    assert header["peak_flops_per_device"] is None  # CPU, no HPCDP_PEAK_FLOPS
    n, layers, width = header["n_params"], 2, 128
    assert header["flops_per_token"] == 6 * (n - 128 * width) + 12 * layers * width * 128

    steps = by_kind["step"]
    assert [s["step"] for s in steps] == [3, 6, 9, 10]  # every log_interval, and the last
    assert all(s["mfu"] is None and s["max_mem_gb"] is None for s in steps)
    assert all(s["loss_scale"] is None and s["skipped"] is False for s in steps)
    assert all(s["tokens_seen"] == s["step"] * 512 for s in steps)
    # One process communicates nothing: a true 0 (DataParallel's unmeasured one is null).
    assert all(s["exposed_comm_s"] == 0.0 and s["allreduce_s"] is None for s in steps)
    for s in steps:
        assert s["tokens_per_s"] == pytest.approx(512 / s["step_time_s"])
    # Linear warm-up: step k of the first 4 uses k/4 of 1e-3; then linear decay from 1e-3 at
    # step 5 by 9e-4/6 per step, reaching min_lr 1e-4 just after the last step (10).
    expected_lr = {3: 1e-3 * 3 / 4, 6: 1e-3 - 9e-4 * 1 / 6, 9: 1e-3 - 9e-4 * 4 / 6,
                   10: 1e-3 - 9e-4 * 5 / 6}
    assert {s["step"]: s["lr"] for s in steps} == pytest.approx(expected_lr)
    assert [e["step"] for e in by_kind["eval"]] == [5, 10]
    assert [c["step"] for c in by_kind["checkpoint"]] == [4, 8, 10]
    assert all(Path(c["path"]).name == f"step-{c['step']:07d}.pt" for c in by_kind["checkpoint"])
    # Only the two newest checkpoints stay on disk, each with its size and digest record.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-0000008.pt", "step-0000008.pt.sha256", "step-0000010.pt",
        "step-0000010.pt.sha256"]
    (summary,) = by_kind["summary"]
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["final_loss"] == steps[-1]["loss"]
    assert summary["final_val_loss"] == by_kind["eval"][-1]["val_loss"]
    # Per elapsed second: warm-up, evaluations and checkpoints in; per step-second: not.
    assert summary["tokens_trained"] == STEPS * 512
    assert summary["tokens_per_elapsed_s"] < summary["tokens_per_s_median"]
    assert summary["replicas_identical"] is True and len(summary["params_sha256"]) == 64


def test_stdout_has_one_documented_line_per_logged_step(run: tuple[Path, str]) -> None:
    out, stdout = run
    matches = [LINE.fullmatch(line) for line in stdout.splitlines() if line.startswith("step ")]
    assert all(matches), stdout
    assert [int(m.group(1)) for m in matches] == [3, 6, 9, 10]
    assert {(m.group(2), m.group(7), m.group(8)) for m in matches} == {
        (str(STEPS), "single-gpu", "1")}
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if '"kind": "step"' in line]
    assert [float(m.group(3)) for m in matches] == [round(s["loss"], 4) for s in steps]


def test_peak_flops_from_the_environment_gives_an_mfu(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HPCDP_PEAK_FLOPS="1e11")
    done = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--out", str(tmp_path), "--set", "train.steps=2", "--set", "data.corpus=synthetic"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    header = recs[0]
    assert header["peak_flops_per_device"] == 1e11
    for step in (r for r in recs if r["kind"] == "step"):
        assert step["mfu"] == pytest.approx(
            header["flops_per_token"] * step["tokens_per_s"] / 1e11)
