"""torch.nn.parallel.DistributedDataParallel: one process per device, all-reduce in buckets.

The paper's "Distributed Parameter Server". NCCL on GPUs, gloo on CPUs (the stock wheel has no
MPI backend). The device is the LOCAL rank's GPU: the paper's code used the global rank, which
is why its DDP could not span nodes.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hpcdp import distenv
from train.strategies import Strategy, device_for


class BucketTimes:
    """Every gradient bucket's all-reduce in the current step, from hpcdp's own comm hook: when
    DDP handed it to the backend (its gradients were ready), when it completed, and its bytes.

    DDP's reducer keeps its own timing, but samples iterations 1-10 and then every 100th, and
    reports an iteration only at the next forward: a 30-step run would log the warm-up's average
    (bucket rebuild included) on every step. CPU: perf_counter, the completion read in the
    future's callback on the backend's thread. CUDA: events, the completion recorded in the
    callback, which runs on streams that wait for the collective; read after the loop's
    synchronize."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.cuda = device, device.type == "cuda"
        self._lock = threading.Lock()
        self._launched: list = []
        self._done: dict[int, object] = {}
        self._bytes: list[int] = []

    def _now(self):
        if self.cuda:
            # The device's current stream, whichever thread calls (the callback's waits for
            # the collective).
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def launch(self, nbytes: int) -> int:
        with self._lock:
            self._launched.append(self._now())
            self._bytes.append(nbytes)
            return len(self._launched) - 1

    def done(self, index: int) -> None:
        mark = self._now()
        with self._lock:
            self._done[index] = mark

    def read(self) -> dict[str, float] | None:
        """This step's buckets (and forget them): `allreduce` = time with at least one bucket
        in flight (queued buckets are not counted twice), `exposed` = from the last bucket's
        launch (backward's last gradient) to the last completion: what backward did not hide,
        `window` = first launch to last completion, `bytes` and `calls`. None: no bucket."""
        with self._lock:
            launched, done, nbytes = self._launched, self._done, self._bytes
            self._launched, self._done, self._bytes = [], {}, []
        spans = [(launched[i], done[i]) for i in range(len(launched)) if i in done]
        if not spans:
            return None
        if self.cuda:  # seconds since the first launch
            first = spans[0][0]
            spans = [(first.elapsed_time(a) / 1e3, first.elapsed_time(b) / 1e3)
                     for a, b in spans]
        busy, reach = 0.0, -math.inf
        for start, end in sorted(spans):
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        last_launch = max(start for start, _ in spans)
        return {"allreduce": busy, "exposed": max(0.0, reach - last_launch),
                "window": reach - min(start for start, _ in spans),
                "bytes": sum(nbytes), "calls": len(spans)}


def timed_hook(times: BucketTimes, dtype: torch.dtype | None = None):
    """A DDP communication hook that all-reduces each bucket (cast to `dtype` first, where
    given: torch's fp16/bf16_compress_hook refuse bf16 without CUDA and NCCL, while gloo reduces
    bf16 on CPUs too), writes the average back, and times it in `times`."""
    def hook(group, bucket):
        group = group or dist.group.WORLD
        buffer = bucket.buffer()
        world = dist.get_world_size(group)
        # fp32: scaled by 1/world as DDP's built-in all-reduce scales gradients into the bucket
        # (the same products, so the same sums); compressed: divided after the cast, as
        # torch's compress hooks do.
        sent = buffer.mul_(1.0 / world) if dtype is None else buffer.to(dtype).div_(world)
        mark = times.launch(sent.numel() * sent.element_size())
        future = dist.all_reduce(sent, group=group, async_op=True).get_future()

        def finish(fut):
            times.done(mark)
            if sent is not buffer:
                buffer.copy_(fut.value()[0])
            return buffer
        return future.then(finish)
    return hook


COMPRESS_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


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
        # Every bucket timed, every step; compressed: each bucket cast before, back after.
        self._times = BucketTimes(self.device)
        ddp.register_comm_hook(None, timed_hook(self._times, COMPRESS_DTYPES.get(self.grad_comm)))
        # A weak reference: the wrapped model must be freed with the loop's frame, before
        # teardown destroys the process group (freed after it, DDP's destructor can hang).
        self._ddp = weakref.ref(ddp)
        return ddp, optimizer

    def comm_breakdown(self):
        """This step's gradient all-reduce, bucket by bucket (BucketTimes.read); None with one
        rank (no wrapper, nothing sent)."""
        times = getattr(self, "_times", None)
        return times.read() if times is not None else None

    def exposed_comm(self, phases, comm):
        if self.world_size == 1:
            return 0.0  # gradients stay local: no communication, a true zero
        return comm["exposed"] if comm else None

    def no_sync(self, model):
        return model.no_sync() if self.world_size > 1 else super().no_sync(model)

    def mean(self, tensor):
        tensor = tensor.detach().clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return tensor / self.world_size

    def all_reduce_(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def all_reduce_max_(self, tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)

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
