"""`--resume-from RUN_DIR` (issue 36, item 4): a run continued on another number of nodes, in a
run folder of its own. On the local cluster: fsdp on 2 nodes x 2 ranks, continued on 1 node x 2
ranks (its sharded checkpoint resharded from 4 ranks to 2, micro_batch_size doubled so the
global batch stays), then back on 2 x 2. Every way in reads the same setting
(train.resume_from): submit here, a script sbatch'ed by hand and `hpcdp run` below."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_jobs import beside_partition, records, sets, wait_all

SETTINGS = sets("data.corpus=synthetic", "train.eval_interval=0", "cluster.cpu_ranks_per_node=2")


def hpcdp(*args: str, cwd: Path, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def submitted(done: subprocess.CompletedProcess) -> Path:
    assert done.returncode == 0, done.stdout + done.stderr
    return Path(re.search(r"run:\s+(\S.*)", done.stdout).group(1).strip())


def steps_and_world(run_dir: Path) -> tuple[list[int], int, dict]:
    recs = records(run_dir)
    header = next(r for r in recs if r["kind"] == "header")
    return [r["step"] for r in recs if r["kind"] == "step"], header["world_size"], header


@pytest.mark.slurm
@pytest.mark.gpu_partition  # its 2 nodes are enough: it runs beside the debug partition's tests
def test_a_sharded_run_moves_from_2x2_ranks_to_1x2_and_back(slurm_cluster, tmp_path):
    settings = [*SETTINGS, *sets(f"cluster.partition={beside_partition()}")]
    first = submitted(hpcdp("submit", "-s", "fsdp", "--nodes", "2", "--out", str(tmp_path / "a"),
                            *settings, *sets("train.steps=4"), "--wait", cwd=tmp_path))
    steps, world, header = steps_and_world(first)
    assert (steps, world) == ([1, 2, 3, 4], 4)
    micro = header["config"]["train"]["micro_batch_size"]

    # 1 node x 2 ranks: micro_batch_size doubled keeps the sequences per micro-step
    done = hpcdp("submit", "-s", "fsdp", "--nodes", "1", "--out", str(tmp_path / "b"),
                 "--resume-from", str(first), *settings, *sets("train.steps=7"), "--wait",
                 cwd=tmp_path)
    second = submitted(done)
    steps, world, header = steps_and_world(second)
    assert (steps, world) == ([5, 6, 7], 2), (steps, world)
    assert header["config"]["train"]["micro_batch_size"] == 2 * micro
    assert header["resumed_from"].startswith(str(first / "checkpoints" / "step-0000004"))
    log = "".join(p.read_text() for p in second.glob("slurm-*.out"))
    assert "resharded the checkpoint's state from 4 ranks to 2" in log, log[-3000:]

    # and back on 2 x 2, from the 1-node folder's own checkpoint; by hand with plain sbatch
    rendered = hpcdp("render", "-s", "fsdp", "--nodes", "2", "--out", str(tmp_path / "c"),
                     "--resume-from", str(second), *settings, *sets("train.steps=9"),
                     cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    script = next((tmp_path / "c").rglob("job.sbatch"))
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert wait_all([job_id], timeout_s=400)[job_id].state == "COMPLETED"
    steps, world, header = steps_and_world(script.parent)
    assert (steps, world) == ([8, 9], 4) and header["config"]["train"]["micro_batch_size"] == micro
    assert "step-0000007" in header["resumed_from"]
    # the first run's folder is left as it was: its own four steps
    assert steps_and_world(first)[0] == [1, 2, 3, 4]


@pytest.fixture(scope="module")
def ddp_run(local_ddp_run) -> Path:
    """A finished 2-rank DDP run (whole-state checkpoints) by `hpcdp run`: tests/conftest.py's
    shared one, which the tests below read and never write."""
    return local_ddp_run["run_dir"]


def test_resume_from_refuses_what_cannot_continue(ddp_run, tmp_path):
    """One line, exit 2, nothing written: no run there, a run with no checkpoint, its own
    folder, a checkpoint of the other kind, a world its sequences do not divide over."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "experiment.yaml").write_text((ddp_run / "experiment.yaml").read_text())
    own_out = str(ddp_run.parent.parent)
    cases = [
        (["-s", "fsdp", "--resume-from", str(tmp_path / "nothing")], "holds no experiment.yaml"),
        (["-s", "fsdp", "--resume-from", str(empty)], "holds no checkpoint to continue from"),
        (["-s", "distributed-ps", "--ranks", "2", "--resume-from", str(ddp_run), "--out",
          own_out], "is this job's own run folder"),
        (["-s", "fsdp", "--resume-from", str(ddp_run), "--out", str(tmp_path / "x")],
         "distributed-ps wrote whole-state checkpoints, which fsdp cannot load"),
        (["-s", "distributed-ps", "--ranks", "3", "--resume-from", str(ddp_run), "--out",
          str(tmp_path / "y")], "which 3 ranks cannot share evenly"),
        (["-s", "fsdp", "--resume-from", str(ddp_run), "--experiment", "paper"],
         "not --experiment"),
    ]
    for args, says in cases:
        done = hpcdp("run", *args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and says in done.stderr, (args, done.stderr)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_hpcdp_run_and_python_m_train_continue_the_same_way(ddp_run, tmp_path):
    trained, _, header = steps_and_world(ddp_run)
    done, micro = trained[-1], header["config"]["train"]["micro_batch_size"]
    moved = hpcdp("run", "-s", "single-gpu", "--out", str(tmp_path / "one"), "--resume-from",
                  str(ddp_run), *sets(f"train.steps={done + 2}"), cwd=tmp_path)
    assert moved.returncode == 0, moved.stderr[-2000:]
    steps, world, header = steps_and_world(tmp_path / "one" / "smoke" / "single-gpu-1n")
    assert (steps, world) == ([done + 1, done + 2], 1)
    assert header["config"]["train"]["micro_batch_size"] == 2 * micro
    # python -m train reads the same setting, by hand
    by_hand = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", str(ddp_run / "experiment.yaml"),
         "--strategy", "single-gpu", "--out", str(tmp_path / "hand"),
         *sets(f"train.resume_from={ddp_run}", f"train.micro_batch_size={2 * micro}",
               f"train.steps={done + 1}")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert by_hand.returncode == 0, by_hand.stderr[-2000:]
    assert steps_and_world(tmp_path / "hand")[0] == [done + 1]
    summary = json.loads((tmp_path / "hand" / "metrics.jsonl").read_text().splitlines()[-1])
    assert summary["kind"] == "summary" and summary["status"] == "completed"


def test_a_run_still_training_is_not_resumed_from_at_any_way_in(tmp_path):
    """Issue 48, item 2: a run continued while its source still trains would fork it, at
    whichever checkpoint was newest when the new job started (the source meanwhile deletes old
    ones). A source paused after step 2 with a checkpoint (HPCDP_FAULT=pause@2), holding its
    folder: submit, run and `python -m train` (a rendered script by hand runs it) each refuse
    in one line naming its trainer; nothing is written."""
    import time

    from hpcdp import run_lock

    live = tmp_path / "live"
    source = subprocess.Popen(
        [sys.executable, "-m", "hpcdp", "run", "-s", "single-gpu", "--out", str(live),
         *sets("data.corpus=synthetic", "train.eval_interval=0", "train.steps=50",
               "train.checkpoint_interval=1")],
        cwd=tmp_path, env={**os.environ, "HPCDP_FAULT": "pause@2"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = live / "smoke" / "single-gpu-1n"
    try:
        deadline = time.monotonic() + 180
        while not (list(run_dir.glob("checkpoints/step-*"))
                   and run_lock.holder(run_dir)):
            assert source.poll() is None and time.monotonic() < deadline, "the source never paused"
            time.sleep(0.5)
        ways = {
            "submit": [sys.executable, "-m", "hpcdp", "submit", "-s", "single-gpu",
                       "--resume-from", str(run_dir), "--out", str(tmp_path / "a"), "--dry-run"],
            "run": [sys.executable, "-m", "hpcdp", "run", "-s", "single-gpu", "--resume-from",
                    str(run_dir), "--out", str(tmp_path / "b")],
            "python -m train": [sys.executable, "-m", "train", "--experiment",
                                str(run_dir / "experiment.yaml"), "--strategy", "single-gpu",
                                "--out", str(tmp_path / "c"),
                                *sets(f"train.resume_from={run_dir}")],
        }
        for way, argv in ways.items():
            done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 2, (way, done.stdout[-1000:], done.stderr[-2000:])
            (line,) = [x for x in done.stderr.splitlines() if "is still training" in x]
            assert f"{str(run_dir)!r} is still training (pid " in line, (way, line)
            assert "Traceback" not in done.stderr, (way, done.stderr)
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    finally:
        source.terminate()  # the paused run stops with a checkpoint
        source.wait(timeout=120)
