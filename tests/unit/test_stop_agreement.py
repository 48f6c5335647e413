"""The stop agreement (train/stop.py) between two real gloo ranks: all ranks stop at the same
step whichever rank was signalled, all ranks take a time-based checkpoint at the same step
whichever rank's clock said it was due, and between checks nothing is communicated."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from free_port import free_port

from train import stop


class _GlooRanks:
    """The one collective StopSignal uses, over a real gloo group, counting calls."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size, self.calls = rank, world, 0

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor / self.world_size


def _rank(rank: int, world: int, port: int, signalled_rank: int, signal_at: int,
          due_at: int, out) -> None:
    """Rank `signalled_rank` is signalled at step `signal_at`, and its clock alone says a
    checkpoint is due from step `due_at` on (the other rank's clock is behind)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ranks, signal = _GlooRanks(rank, world), stop.StopSignal(check_every_s=1.0)
    signal.restore()  # the handlers are not what is tested here
    stopped_at, checkpoints = None, []
    for step in range(1, 200):
        if rank == signalled_rank and step == signal_at:
            signal.name = "SIGUSR2"
        due = rank == signalled_rank and step >= due_at and not checkpoints
        agreed = signal.agreed(ranks, torch.device("cpu"), step, step_time_s=0.1,  # ~10 steps
                               checkpoint_due=due)
        if agreed.checkpoint:
            checkpoints.append(step)
        if agreed.stop:
            stopped_at = step
            break
    out.put((rank, stopped_at, ranks.calls, signal.name, checkpoints))
    dist.destroy_process_group()



@pytest.mark.parametrize("signalled_rank", [0, 1])
def test_every_rank_stops_at_the_same_step_with_few_collectives(signalled_rank):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # Both ranks need the same port: pick it once.
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, signalled_rank, 37, 15, out))
             for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    (_, stop0, calls0, _, saved0), (_, stop1, calls1, _, saved1) = results
    assert stop0 == stop1 and stop0 is not None and 37 <= stop0 <= 37 + 10
    assert calls0 == calls1 <= 6  # checks at steps 1, 11, 21, 31, 41: not one per step
    other = 1 - signalled_rank
    assert results[other][3] == "stop signal (on another rank)"
    # One rank's clock said "due" from step 15: both checkpoint once, at the same check step.
    assert saved0 == saved1 and len(saved0) == 1 and 15 <= saved0[0] <= 15 + 10, results
