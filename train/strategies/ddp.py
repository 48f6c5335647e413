"""torch.nn.parallel.DistributedDataParallel: one process per device, all-reduce in buckets.

The paper's "Distributed Parameter Server". NCCL on GPUs, gloo on CPUs (the stock wheel has no
MPI backend). The device is the LOCAL rank's GPU: the paper's code used the global rank, which
is why its DDP could not span nodes.
"""

from __future__ import annotations

import os
import socket
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hpcdp import distenv
from train.strategies import Strategy, device_for


def _compress_hook(dtype: torch.dtype):
    """A DDP communication hook that all-reduces each gradient bucket in `dtype` and writes the
    average back: torch's fp16/bf16_compress_hook, which refuse bf16 without CUDA and NCCL, while
    gloo reduces bf16 on CPUs too."""
    def hook(group, bucket):
        group = group or dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(fut):
            buffer.copy_(fut.value()[0])
            return buffer
        return future.then(decompress)
    return hook


COMPRESS_HOOKS = {"bf16": _compress_hook(torch.bfloat16), "fp16": _compress_hook(torch.float16)}


class DDPStrategy(Strategy):
    # torch's DDP notes: wrap first, then compile, so that Dynamo's DDPOptimizer breaks the graph
    # at bucket boundaries and all-reduce overlaps the compiled backward.
    compile_around_wrapper = True

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
        if self.world_size == 1:
            # Nothing to average: DDP would only copy every gradient into its buckets and
            # all-reduce them with itself (about 10% of a tiny model's step, bench/overhead.py).
            self.log("DDP: world size 1, gradients stay local (no DDP wrapper)")
            return model, optimizer
        # Construction broadcasts rank 0's parameters and buffers to every rank.
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids)
        if self.grad_comm in COMPRESS_HOOKS:  # each bucket cast before all-reduce, back after
            ddp.register_comm_hook(None, COMPRESS_HOOKS[self.grad_comm])
        # A weak reference: the wrapped model must be freed with the loop's frame, before
        # teardown destroys the process group (freed after it, DDP's destructor can hang).
        self._ddp = weakref.ref(ddp)
        return ddp, optimizer

    def comm_breakdown(self):
        """DDP's own timing of backward (sampled by its reducer at iterations 10, 20, ... and
        then every 100; CUDA events on GPUs): compute, all-reduce, their overlap, and the
        all-reduce time backward did not hide. None until DDP has sampled an iteration."""
        ddp = self._ddp() if getattr(self, "_ddp", None) else None
        data = ddp._get_ddp_logging_data() if ddp is not None else {}
        names = ("avg_backward_compute_time", "avg_backward_comm_time",
                 "avg_backward_compute_comm_overlap_time")
        if not all(isinstance(data.get(n), int) and data.get(n) > 0 for n in names[:2]):
            return None
        compute, comm, overlap = (data.get(n, 0) / 1e9 for n in names)
        return {"backward_compute": compute, "allreduce": comm, "overlap": overlap,
                "exposed": max(0.0, comm - overlap)}

    def no_sync(self, model):
        return model.no_sync() if self.world_size > 1 else super().no_sync(model)

    def mean(self, tensor):
        tensor = tensor.detach().clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return tensor / self.world_size

    def all_reduce_(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

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
