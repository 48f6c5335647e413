"""torch.nn.parallel.DistributedDataParallel: one process per device, all-reduce in buckets.

The paper's "Distributed Parameter Server". NCCL on GPUs, gloo on CPUs (the stock wheel has no
MPI backend). The device is the LOCAL rank's GPU: the paper's code used the global rank, which
is why its DDP could not span nodes.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hpcdp import distenv
from train.strategies import Strategy, device_for


class DDPStrategy(Strategy):
    def setup(self, env, timeout_s: int) -> None:
        self.device = device_for(env)
        # A master that is not rank 0's node would make every rank wait for the timeout.
        distenv.check_master_is_rank0_node(env, socket.gethostname())
        os.environ.update(env.torch_env())
        # NCCL's watchdog aborts a collective stuck past the timeout (the default in recent
        # torch; set for older ones).
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=self.device if self.device.type == "cuda" else None,
        )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.communication = str(dist.get_backend())

    def wrap(self, model, optimizer, accum_steps: int = 1):
        # Construction broadcasts rank 0's parameters and buffers to every rank.
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def no_sync(self, model):
        return model.no_sync()

    def mean(self, tensor):
        tensor = tensor.detach().clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return tensor / self.world_size

    def broadcast_object(self, obj, name: str):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def describe(self) -> str:
        return f"DDP rank {self.rank}/{self.world_size} on {self.device} ({self.communication})"
