"""Checkpoints that cannot be trusted or written (issue 19, items 2 and 3): a damaged newest
checkpoint is skipped for the intact one before it (a file, and a sharded folder of which one
rank's shard is damaged), none intact is one line, and a disk that fills while writing is one
line with the temporary file gone and a resume that continues. The damaged checkpoints are
those a run through a full disk left (one training per strategy serves both)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETS = ["train.log_interval=1", "train.eval_interval=0", "train.checkpoint_interval=4",
        "train.warmup_steps=2", "data.corpus=synthetic", "train.micro_batch_size=4",
        "train.stop_check_s=0", "train.keep_checkpoints=2"]


def train(out: Path, steps: int, resume: bool = False, strategy: str = "single-gpu",
          ranks: int = 1) -> subprocess.CompletedProcess:
    launch = [sys.executable]
    if ranks > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    cmd = [*launch, "-m", "train", "--experiment", "smoke", "--strategy", strategy,
           "--out", str(out), "--set", f"train.steps={steps}"]
    cmd += [a for s in SETS for a in ("--set", s)] + (["--resume"] if resume else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def hpcdp_run(strategy: str, out: Path, steps: int) -> subprocess.CompletedProcess:
    """The issue's way in: `hpcdp run` on 2 local ranks (torchrun under it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "hpcdp", "run", "-s", strategy, "--ranks", "2", "--out", str(out),
         "--set", f"train.steps={steps}", *[a for s in SETS for a in ("--set", s)]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@dataclass
class FullDiskRun:
    """One strategy's 12 steps through a disk that fills at the step-8 checkpoint: the run that
    failed there (None where no tmpfs could be mounted), what it left, the rerun once there is
    room, and the run folder, which then holds the step-8 and step-12 checkpoints."""

    failed: subprocess.CompletedProcess | None
    left: dict[str, list[str]]
    rerun: subprocess.CompletedProcess
    run_dir: Path
    why_not: str

    def failed_or_skip(self) -> subprocess.CompletedProcess:
        if self.failed is None:
            pytest.skip(f"cannot mount a tmpfs here (not root?): {self.why_not}")
        return self.failed

    def copy_to(self, to: Path) -> Path:
        assert self.rerun.returncode == 0, self.rerun.stdout[-2000:] + self.rerun.stderr[-2000:]
        shutil.copytree(self.run_dir, to)
        return to


@pytest.fixture(scope="module")
def through_a_full_disk(tmp_path_factory) -> Iterator[Callable[[str], FullDiskRun]]:
    """strategy -> its FullDiskRun, made once and shared: the full-disk tests check how it
    failed and resumed, the damaged-checkpoint tests damage a copy of the folder it leaves (one
    training fewer each). The disk is a real 8 MB tmpfs (root only): room for one checkpoint of
    the smoke model (5.4 MB, a file or a 2-rank DCP folder), not for the next one beside it.
    Where none can be mounted, the run trains on the normal disk and the full-disk tests skip.
    single-gpu starts as `python -m train`, the others as `hpcdp run` on 2 ranks."""
    made: dict[str, FullDiskRun] = {}
    mounts: list[Path] = []

    def run_through(strategy: str) -> FullDiskRun:
        if strategy in made:
            return made[strategy]
        disk = tmp_path_factory.mktemp(strategy) / "disk"
        disk.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                                 capture_output=True, text=True)
        if mounted.returncode == 0:
            mounts.append(disk)
        if strategy == "single-gpu":
            run_dir = disk / "run"
            launch = functools.partial(train, run_dir, 12)
        else:
            run_dir = disk / "smoke" / f"{strategy}-1n"
            launch = functools.partial(hpcdp_run, strategy, disk, 12)
        failed, left = None, {}
        if mounted.returncode == 0:
            failed = launch()
            left = {"checkpoints": checkpoints(run_dir),
                    "exits": sorted(p.name for p in (run_dir / "ranks").glob("exit-*"))}
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        rerun = launch(resume=True) if strategy == "single-gpu" else launch()
        made[strategy] = FullDiskRun(failed, left, rerun, run_dir, mounted.stderr.strip())
        return made[strategy]

    try:
        yield run_through
    finally:
        for disk in mounts:
            subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one(through_a_full_disk,
                                                                  tmp_path):
    out = through_a_full_disk("single-gpu").copy_to(tmp_path / "run")
    assert checkpoints(out) == ["step-0000008.pt", "step-0000008.pt.sha256",
                                "step-0000012.pt", "step-0000012.pt.sha256"]
    newest = out / "checkpoints" / "step-0000012.pt"
    os.truncate(newest, newest.stat().st_size // 2)
    done = train(out, 16, resume=True)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if "skipped damaged" in line]
    assert len(said) == 1 and "step-0000012.pt (" in said[0] and "when written" in said[0]
    assert "resuming from step-0000008.pt" in said[0]
    assert "resumed from" in done.stdout and "at step 8" in done.stdout
    assert "Traceback" not in done.stderr
    # Now damage every checkpoint left (same size, one byte flipped: only the digest sees it)
    for name in ("step-0000012.pt", "step-0000016.pt"):
        path = out / "checkpoints" / name
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    done = train(out, 20, resume=True)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no intact checkpoint in" in errors[0]
    assert "step-0000016.pt (its sha256 differs" in errors[0] and "step-0000012.pt" in errors[0]
    assert "Traceback" not in done.stderr


def test_a_sharded_checkpoint_with_one_damaged_shard_falls_back_to_the_intact_one(
        through_a_full_disk, tmp_path):
    """fsdp on 2 ranks: each rank writes its shard into step-N.dcp/; the size and digest of
    every file are recorded beside it, so rank 1's shard cut short makes the whole folder
    untrusted, and the resume takes the one before, as it does for a file."""
    out = through_a_full_disk("fsdp").copy_to(tmp_path / "run")
    assert checkpoints(out) == ["step-0000008.dcp", "step-0000008.dcp.sha256",
                                "step-0000012.dcp", "step-0000012.dcp.sha256"]
    shards = sorted((out / "checkpoints" / "step-0000012.dcp").glob("*.distcp"))
    assert len(shards) == 2, shards  # one per rank
    os.truncate(shards[-1], shards[-1].stat().st_size // 2)
    done = train(out, 16, resume=True, strategy="fsdp", ranks=2)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if "skipped damaged" in line]
    assert len(said) == 1 and "step-0000012.dcp (" in said[0], done.stdout[-2000:]
    assert "resuming from step-0000008.dcp" in said[0]
    assert "at step 8" in done.stdout and "Traceback" not in done.stderr


def test_a_full_disk_while_checkpointing_is_one_line_and_the_resume_continues(
        through_a_full_disk):
    run = through_a_full_disk("single-gpu")
    done = run.failed_or_skip()
    assert done.returncode == 1, done.stdout[-1000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on device writing checkpoint" in errors[0]
    assert "MB needed" in errors[0] and "Traceback" not in done.stderr
    left = run.left["checkpoints"]
    assert not [n for n in left if ".tmp-" in n]  # the temporary file is gone
    assert left and left[0].startswith("step-")  # the checkpoint before it is intact
    # space freed, then resumed: it continued from the intact checkpoint
    assert run.rerun.returncode == 0, run.rerun.stderr[-2000:]
    assert "resumed from" in run.rerun.stdout


@pytest.mark.parametrize("strategy,suffix", [("fsdp", ".dcp"), ("distributed-ps", ".pt")])
def test_a_full_disk_during_a_2_rank_save_is_one_line_on_every_rank(through_a_full_disk,
                                                                       strategy, suffix):
    """Issue 36 item 1: a sharded (DCP) save that fills the disk ended in 7 tracebacks with its
    temporary folder left behind (DCP's CheckpointException is a BaseException, and ranks other
    than 0 saved outside the clean-up); a one-file save's line was followed by rank 1's gloo
    traceback. Now: rank 0's one line, the other rank quiet, torchrun's one line, no temporary
    left, every rank's exit recorded, and a resume that continues once there is room."""
    run = through_a_full_disk(strategy)
    done = run.failed_or_skip()
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on device writing checkpoint" in errors[0], said
    assert f"step-0000008{suffix}" in errors[0] and "MB free" in errors[0]
    assert "Traceback" not in said and "could not record the exit code" not in said, said
    assert "torchrun: rank" in said and "ChildFailedError" not in said
    assert run.left["checkpoints"] == [f"step-0000004{suffix}", f"step-0000004{suffix}.sha256"]
    assert run.left["exits"] == ["exit-0", "exit-1"]
    done = run.rerun
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "at step 4" in done.stdout and "Traceback" not in done.stderr
