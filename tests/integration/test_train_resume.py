"""Stop a run part-way (SIGTERM, as Slurm sends before a time limit or preemption), continue it
with --resume, and get exactly the losses of a run that was never stopped.

Same seed, same thread count (1), same process count: the losses must be bit-identical, not
close. The data stream position, optimizer, RNG and learning-rate schedule all come back from
the checkpoint; anything forgotten shows up as a different loss after the stop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from free_port import free_port

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12
SETS = [f"train.steps={STEPS}", "train.log_interval=1", "train.eval_interval=4",
        "train.checkpoint_interval=0", "train.warmup_steps=2", "data.corpus=synthetic",
        "train.micro_batch_size=4", "train.grad_accum_steps=2",
        "train.stop_check_s=0"]  # 12 steps take under a second: agree after every step
INTERRUPTED_EXIT = 143


def _env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_"))}
    env.update(OMP_NUM_THREADS="1", MASTER_PORT=str(port),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def command(out: Path, strategy: str, procs: int, port: int, resume: bool) -> list[str]:
    if procs == 1:
        cmd = [sys.executable, "-m", "train"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "train"]
    cmd += ["--experiment", "smoke", "--strategy", strategy, "--out", str(out)]
    cmd += [a for s in SETS for a in ("--set", s)]
    return cmd + (["--resume"] if resume else [])


def run_to_end(out: Path, strategy: str, procs: int, port: int,
               resume: bool = False) -> subprocess.CompletedProcess:
    done = subprocess.run(command(out, strategy, procs, port, resume), cwd=ROOT,
                          env=_env(port), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def run_and_stop(out: Path, strategy: str, procs: int, port: int, after_step: int,
                 signal_one_rank: bool) -> tuple[int, str]:
    """Start a run, send SIGTERM once `after_step` was logged; returns (exit code, stdout)."""
    proc = subprocess.Popen(command(out, strategy, procs, port, False), cwd=ROOT,
                            env=_env(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(f"step {after_step}/"):
                target = proc.pid
                if signal_one_rank:
                    # Only the last worker gets the signal: the ranks must agree to stop.
                    children = subprocess.run(["pgrep", "-P", str(proc.pid)],
                                              capture_output=True, text=True).stdout.split()
                    target = int(children[-1])
                os.kill(target, signal.SIGTERM)
                break
        lines += proc.stdout.readlines()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(lines) + proc.stderr.read()


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def losses(recs: list[dict], kind: str = "step", field: str = "loss") -> dict[int, float]:
    """step -> value, later segments overriding earlier ones."""
    return {r["step"]: r[field] for r in recs if r["kind"] == kind}


# One process stopping and resuming is in test_resume_every_strategy.py (single-gpu, single-ps);
# here two ranks, only one of them signalled, must agree to stop.
@pytest.mark.parametrize(("strategy", "procs", "signal_one_rank"), [
    ("distributed-ps", 2, True),
])
def test_stop_and_resume_gives_the_uninterrupted_losses(
        tmp_path: Path, strategy: str, procs: int, signal_one_rank: bool) -> None:
    port = free_port()
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    run_to_end(straight, strategy, procs, port)

    code, output = run_and_stop(stopped, strategy, procs, port + 10, after_step=3,
                                signal_one_rank=signal_one_rank)
    assert code == INTERRUPTED_EXIT if procs == 1 else code != 0, output[-3000:]
    first = records(stopped)
    (summary,) = [r for r in first if r["kind"] == "summary"]
    assert summary["status"] == "interrupted"
    stop_step = summary["steps"]
    assert 3 <= stop_step < STEPS, output
    assert [r["step"] for r in first if r["kind"] == "checkpoint"] == [stop_step]
    assert "run again with --resume" in output

    time.sleep(1)  # distinct ports aside, let the old rendezvous sockets close
    resumed = run_to_end(stopped, strategy, procs, port + 20, resume=True)
    assert f"resumed from {stopped / 'checkpoints'}" in resumed.stdout
    everything = records(stopped)
    headers = [r for r in everything if r["kind"] == "header"]
    assert [h["start_step"] for h in headers] == [0, stop_step]
    assert headers[1]["resumed_from"].endswith(f"step-{stop_step:07d}.pt")
    second = everything[everything.index(headers[1]):]
    assert min(r["step"] for r in second if r["kind"] == "step") == stop_step + 1

    reference = records(straight)
    assert losses(everything) == losses(reference)  # bit-identical, every step
    assert losses(everything, "eval", "val_loss") == losses(reference, "eval", "val_loss")
    assert losses(everything, "step", "lr") == losses(reference, "step", "lr")


def test_resume_without_checkpoint_starts_fresh_and_after_the_end_does_nothing(
        tmp_path: Path) -> None:
    first = run_to_end(tmp_path, "single-gpu", 1, free_port(), resume=True)
    assert "no checkpoint in" in first.stdout and "starting fresh" in first.stdout
    again = run_to_end(tmp_path, "single-gpu", 1, free_port(), resume=True)
    assert "nothing to do" in again.stdout
    recs = records(tmp_path)
    assert [r["start_step"] for r in recs if r["kind"] == "header"] == [0, STEPS]
    assert len([r for r in recs if r["kind"] == "step"]) == STEPS  # no step ran twice


def test_a_stop_signal_while_starting_checkpoints_instead_of_killing(tmp_path: Path) -> None:
    """USR2 (Slurm's time-limit warning) that arrives while the rank is still importing torch
    used to kill it: no checkpoint, and the requeued job started again from step 0."""
    port = free_port()
    proc = subprocess.Popen(command(tmp_path, "single-gpu", 1, port, False), cwd=ROOT,
                            env=_env(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # As soon as the rank catches USR2 (train.stop.catch_early, just before `import torch`,
    # which takes seconds): a fixed sleep once signalled it before then on a loaded machine.
    # Before that point (interpreter start, the allocator's re-exec) a signal still kills it.
    deadline = time.monotonic() + 60
    while not _catches(proc.pid, signal.SIGUSR2):
        assert proc.poll() is None, "the run ended before it could be signalled"
        assert time.monotonic() < deadline, "the rank never installed its USR2 handler"
        time.sleep(0.005)
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == INTERRUPTED_EXIT, err[-3000:]
    summary = records(tmp_path)[-1]
    assert summary["kind"] == "summary" and summary["status"] == "interrupted"
    assert (tmp_path / "checkpoints" / f"step-{summary['steps']:07d}.pt").exists()
    assert "SIGUSR2 received" in out


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _run(out: Path, strategy: str, procs: int, port: int, *extra: str, resume: bool = False,
         fault: str | None = None) -> subprocess.CompletedProcess:
    env = _env(port) | ({"HPCDP_FAULT": fault} if fault else {})
    cmd = command(out, strategy, procs, port, resume) + [a for s in extra for a in ("--set", s)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """One process, never stopped: the reference of the two tests below (one run, not two)."""
    out = tmp_path_factory.mktemp("straight")
    run_to_end(out, "single-gpu", 1, free_port())
    return out


def test_a_sigkilled_run_resumes_from_its_last_time_based_checkpoint(
        tmp_path: Path, straight: Path) -> None:
    """A hard kill (node failure, scontrol requeue) gives no signal to checkpoint on: what
    survives is the last time-based checkpoint. Step 6 is computed, killed before its
    checkpoint, and computed again after the resume; it counts once."""
    killed = tmp_path / "killed"
    every_step = "train.checkpoint_every_s=0.001"  # every step is "due"; kill@6 lands before 6's
    first = _run(killed, "single-gpu", 1, free_port(), every_step, fault="kill@6")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert checkpoint_steps(killed) == [4, 5]  # keep_checkpoints=2
    again = _run(killed, "single-gpu", 1, free_port(), every_step, resume=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stdout and "at step 5" in again.stdout
    recs = records(killed)
    assert [r["step"] for r in recs if r["kind"] == "step"].count(6) == 2  # computed twice
    assert losses(recs) == losses(records(straight))  # the later value of step 6 counts
    from hpcdp import harvest

    (row,) = harvest.harvest([killed], query_slurm=False)
    assert row.steps == STEPS and row.final_loss == records(straight)[-1]["final_loss"]


def checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("step-*.pt"))


def test_resume_refuses_a_data_stream_it_cannot_continue_and_continues_another_world(
        tmp_path: Path, straight: Path) -> None:
    out = tmp_path / "run"
    every_step = "train.checkpoint_every_s=0.001"
    first = _run(out, "single-gpu", 1, free_port(), every_step, fault="kill@4")  # checkpoint at 3
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    # Micro batch 8 instead of 4 (x accumulation 2): other samples per position: refused.
    bigger = _run(out, "single-gpu", 1, free_port(), "train.micro_batch_size=8", resume=True)
    assert bigger.returncode == 2
    (line,) = bigger.stderr.strip().splitlines()
    assert "sequences_per_micro_step 4 (now 8)" in line and "another --out" in line
    # Two DDP ranks of micro batch 2 draw the same 4 sequences per micro-step: it continues.
    wider = _run(out, "distributed-ps", 2, free_port(), "train.micro_batch_size=2", resume=True)
    assert wider.returncode == 0, wider.stderr[-3000:]
    assert "continues exactly" in wider.stdout and "at step 3" in wider.stdout
    # Two ranks sum gradients in another order than one process: equal to rounding.
    assert losses(records(out)) == pytest.approx(losses(records(straight)), rel=1e-5)
