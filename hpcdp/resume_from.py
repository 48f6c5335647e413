"""`--resume-from RUN_DIR`: continue a run in another run folder, on another number of nodes or
ranks per node. A run folder is named by its node count, so the same run on 1 node instead of 2
is another folder; this is the documented way across (docs/reliability.md).

What carries over, and why it continues exactly:
- the experiment: the earlier run's own experiment.yaml (with --set on top), not a shipped one;
- the data stream: a resumed run must draw the same sequences per micro-step over all ranks
  (micro_batch_size x world size) and the same accumulation (train/loop.py checks it), so
  micro_batch_size is set to keep it on the new world size, unless --set gives it;
- the state: the new folder starts from the earlier run's newest intact checkpoint
  (train.resume_from, read by train/loop.py when the new folder has none of its own). A
  sharded (DCP) checkpoint reshards to the new world size on load; a whole-state one loads on
  any. Once the new folder has checkpoints of its own, a requeue resumes from those.

Checked here, before anything is written: the earlier folder holds a run and a checkpoint, the
new folder is another one, the checkpoint's kind suits the strategy, and the sequences per
micro-step divide over the new world."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from hpcdp import run_folder, run_lock
from hpcdp.errors import UsageError
from hpcdp.run_folder import CHECKPOINT_DIR, CHECKPOINT_NAME, EXPERIMENT_FILE, METRICS_FILE
from hpcdp.strategies import StrategySpec


@dataclass(frozen=True)
class EarlierRun:
    run_dir: Path
    strategy: str
    world_size: int
    micro_batch_size: int
    sharded: bool
    """Whether its checkpoints are sharded (DCP folders) or whole-state files."""
    step: int
    """The newest checkpoint's step."""

    @property
    def sequences_per_micro_step(self) -> int:
        return self.micro_batch_size * self.world_size


@functools.lru_cache(maxsize=8)
def read(run_dir: Path) -> EarlierRun:
    """The run in `run_dir` that a new folder continues; one line when it cannot be. Cached:
    the CLI reads it to build the experiment and again to check the rendered job."""
    run_dir = Path(run_dir).expanduser().absolute()
    where = f"--resume-from {str(run_dir)!r}"
    run_lock.refuse_if_training(run_dir, "--resume-from")
    if not (run_dir / EXPERIMENT_FILE).is_file():
        raise UsageError(f"{where} holds no {EXPERIMENT_FILE}: give a run folder hpcdp wrote "
                         "(OUT/EXPERIMENT/STRATEGY-Nn)")
    header = _last_header(run_dir / METRICS_FILE)
    found = sorted((int(m[1]), m[2]) for p in (run_dir / CHECKPOINT_DIR).glob("step-*")
                   if (m := CHECKPOINT_NAME.fullmatch(p.name)))
    if header is None or not found:
        raise UsageError(f"{where} holds no checkpoint to continue from (checkpoints/ is empty "
                         "or missing): let the run checkpoint first (train.checkpoint_interval,"
                         " or a stop signal), or start a new run")
    train = header.get("config", {}).get("train", {})
    return EarlierRun(run_dir, str(header.get("strategy")), int(header["world_size"]),
                      int(train.get("micro_batch_size", 0)), found[-1][1] == "dcp",
                      found[-1][0])


def _last_header(metrics: Path) -> dict | None:
    headers = [r for r in run_folder.read_metrics(metrics, ("header",)) if r.get("world_size")]
    return headers[-1] if headers else None


def overrides(earlier: EarlierRun, world_size: int, given: dict) -> dict:
    """`given` (the --set tree) with the settings that continue `earlier` on `world_size`
    ranks: train.resume_from, and micro_batch_size keeping the sequences per micro-step unless
    `given` sets it."""
    train = {"resume_from": str(earlier.run_dir)}
    if "micro_batch_size" not in given.get("train", {}):
        per_step = earlier.sequences_per_micro_step
        if per_step % world_size:
            raise UsageError(
                f"--resume-from: the run drew {per_step} sequences per micro-step "
                f"({earlier.micro_batch_size} x {earlier.world_size} ranks), which {world_size} "
                f"ranks cannot share evenly; use a world size that divides {per_step}")
        train["micro_batch_size"] = per_step // world_size
    return {**given, "train": {**given.get("train", {}), **train}}


def check(earlier: EarlierRun, spec: StrategySpec, run_dir: Path) -> None:
    """The new job can continue `earlier`: another folder, a checkpoint of its kind."""
    if Path(run_dir).absolute() == earlier.run_dir:
        raise UsageError(f"--resume-from {str(earlier.run_dir)!r} is this job's own run folder: "
                         "resubmit without --resume-from to continue it there")
    if spec.sharded_checkpoints != earlier.sharded:
        kind = "sharded (DCP)" if earlier.sharded else "whole-state"
        raise UsageError(f"--resume-from: {earlier.strategy} wrote {kind} checkpoints, which "
                         f"{spec.name} cannot load; continue it with a strategy that "
                         f"{'shards' if earlier.sharded else 'does not shard'} its state")
