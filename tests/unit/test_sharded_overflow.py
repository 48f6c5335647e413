"""fp16 loss scaling under FSDP2 and HSDP, between four real gloo ranks: each rank unscales only
its shard of the gradients, so an inf in one rank's shard must skip the step on every rank, or
the replicas drift apart. hpcdp relies on DTensor for that (it reduces GradScaler's found-inf
flag with MAX over the shards); this test is what would notice if torch stopped doing it."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from free_port import free_port
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from train.precision import Precision

# FSDP over all four ranks, and HSDP as 2 replicas x 2 shards: both meshes in one spawn of four
# processes (each starts by importing torch and FSDP: four processes fewer than a spawn each).
MESHES = {"fsdp": (4,), "hsdp-2x2": (2, 2)}


def _rank(rank: int, world: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for name, mesh_shape in MESHES.items():
        out.put((name, *_overflow_step(rank, world, mesh_shape)))
    dist.destroy_process_group()


def _overflow_step(rank: int, world: int, mesh_shape: tuple[int, ...]) -> tuple:
    """(rank, skipped, changed, finite) of one fp16 step whose last rank overflows."""
    torch.manual_seed(0)
    # One weight row per output; with 4 ranks each holds two rows (HSDP: each replica's pair
    # of ranks holds four).
    model = torch.nn.Linear(1, 8, bias=False)
    names = ("replicate", "shard")[-len(mesh_shape):]  # HSDP's, as train/strategies/fsdp.py
    fully_shard(model, mesh=init_device_mesh("cpu", mesh_shape, mesh_dim_names=names))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp16", "cpu", use_autocast=False)  # FSDP casts; the scaler is on
    # The last rank's loss overflows through output 7 only, as a large activation would: after
    # the reduction only the shard holding row 7 has an inf gradient.
    weights = torch.ones(8)
    if rank == world - 1:
        weights[7] = float("inf")
    loss = (model(torch.ones(4, 1)) * weights).sum()
    precision.backward(loss, optimizer, last=True, before_unscale=lambda: None)
    finite = bool(torch.isfinite(model.weight.grad.to_local()).all())
    before = model.weight.full_tensor().clone()
    skipped = precision.step(optimizer)
    # The whole parameter: the other ranks' shards move only if those ranks stepped.
    changed = not torch.equal(model.weight.full_tensor(), before)
    return rank, skipped, changed, finite


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[tuple]]:
    """Each mesh's (rank, skipped, changed, finite) of the four ranks."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 4, port, out)) for r in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in range(len(procs) * len(MESHES))]
    for p in procs:
        p.join(timeout=60)
    return {name: sorted(r[1:] for r in results if r[0] == name) for name in MESHES}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_an_inf_in_one_ranks_shard_skips_the_step_on_every_rank(outcomes, mesh):
    results = outcomes[mesh]
    assert len(results) == 4, outcomes
    # Some ranks' shards were finite (else nothing here needed agreeing), yet all skipped.
    assert any(finite for *_, finite in results) and not all(finite for *_, finite in results)
    assert [skipped for _, skipped, _, _ in results] == [True] * 4
    assert not any(changed for _, _, changed, _ in results)
