"""Horovod: hvd.DistributedOptimizer all-reduces gradients as backward produces them.

The paper's "Horovod". Gradients of `accum_steps` backward passes are summed locally before one
all-reduce (backward_passes_per_step). With a GradScaler, gradients must be all-reduced before
they are unscaled: `prepare_unscale` calls optimizer.synchronize(), and the optimizer step then
runs inside `optimizer.skip_synchronize()` so it does not all-reduce a second time.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import torch

from hpcdp import distenv
from hpcdp.errors import UsageError
from train.strategies import Strategy, device_for


def import_horovod() -> Any:
    try:
        import horovod.torch as hvd  # type: ignore[import-not-found]
    except ImportError as exc:
        raise UsageError(
            f"horovod is not installed: run scripts/install-horovod.sh ({exc})"
        ) from None
    return hvd


class HorovodStrategy(Strategy):
    hvd: Any = None
    _rendezvous: Any = None

    def setup(self, env, timeout_s: int) -> None:
        hvd = self.hvd = import_horovod()
        # A stall (a rank missing from a collective) shuts Horovod down instead of warning
        # forever, and Gloo's rendezvous and operations time out: both after timeout_s.
        os.environ.setdefault("HOROVOD_STALL_CHECK_TIME_SECONDS", str(min(60, timeout_s)))
        os.environ.setdefault("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", str(timeout_s))
        os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(timeout_s))
        if not torch.cuda.device_count():
            # CPU ranks: Open MPI busy-polls while it waits, and that steals the core the
            # rank computes on (docs/performance.md, bench/horovod_knobs.py). Read by
            # MPI_Init, in hvd.init().
            os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
        if wants_slurm_gloo_rendezvous(env, os.environ):
            # Rank 0 serves the rendezvous at the master address: it must be its own node.
            distenv.check_master_is_rank0_node(env, socket.gethostname())
            self._rendezvous = gloo_rendezvous(env, timeout_s)
        hvd.init()
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.communication = "horovod-mpi" if hvd.mpi_enabled() else "horovod-gloo"
        if self.world_size == 1:
            # One rank has nothing to communicate, and Horovod's background thread, waking
            # every cycle, cost about 5% of a tiny model's step (bench/overhead.py).
            hvd.shutdown()
            self.hvd = None
        elif hvd.mpi_enabled() and os.environ.get("OMPI_MCA_mpi_yield_when_idle") == "1":
            self.log("Horovod: Open MPI yields the CPU while it waits "
                     "(OMPI_MCA_mpi_yield_when_idle=1)")
        self.device = device_for(env)  # env.local_rank is hvd.local_rank() under srun

    def wrap(self, model, optimizer, accum_steps: int = 1):
        if self.hvd is None:
            # One rank, Horovod shut down in setup: nothing to average (DistributedOptimizer
            # sent each gradient through Horovod's thread: about 10% of a tiny step).
            self.log("Horovod: world size 1, gradients stay local (no DistributedOptimizer)")
            return model, optimizer
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # No hvd.broadcast_optimizer_state: a fresh optimizer is identical on every rank, and a
        # resumed one loads the same checkpoint on every rank (after wrap). Horovod's broadcast
        # would take a zero-gradient AdamW step on a fresh optimizer, and on a resumed one round
        # every hyper-parameter (betas, eps, weight decay) through a float32 tensor, so a resumed
        # run would drift from the uninterrupted one after its first step.
        distributed = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=accum_steps,
            compression=hvd.Compression.fp16 if self.grad_comm == "fp16" else hvd.Compression.none,
        )
        # DistributedOptimizer is a new optimizer built from the old one's param_groups only;
        # a resumed run loads its state after `wrap` (train/loop.py).
        return model, distributed

    # One rank (self.hvd None after setup): the base class's one-process answers.
    def mean(self, tensor):
        if self.hvd is None:
            return super().mean(tensor)
        return self.hvd.allreduce(tensor.detach(), op=self.hvd.Average, name="metric_mean")

    def all_reduce_(self, tensor):
        if self.hvd is not None:
            self.hvd.allreduce_(tensor, op=self.hvd.Sum, name="allreduce_baseline")

    def all_reduce_max_(self, tensor):
        if self.hvd is not None:
            self.hvd.allreduce_(tensor, op=self.hvd.Max, name="allreduce_max")

    def exposed_comm(self, phases, comm):
        # synchronize() after backward waits for every all-reduce backward did not hide.
        return phases["sync"] if self.hvd is not None else 0.0

    def prepare_unscale(self, optimizer) -> None:
        if self.hvd is not None:
            optimizer.synchronize()

    def optimizer_step_context(self, optimizer):
        if self.hvd is None:
            return super().optimizer_step_context(optimizer)
        return optimizer.skip_synchronize()

    def broadcast_object(self, obj, name: str):
        # Without a name Horovod names the collective after type(obj): rank 0 sending a str
        # while the others pass None would wait on two different collectives forever.
        if self.hvd is None:
            return obj
        return self.hvd.broadcast_object(obj, root_rank=0, name=f"broadcast_object.{name}")

    def barrier(self) -> None:
        if self.hvd is not None:
            self.hvd.allreduce(torch.zeros(1), name="barrier")

    def teardown(self) -> None:
        if self.hvd is not None:
            self.hvd.shutdown()
        if self._rendezvous is not None:
            self._rendezvous.shutdown()

    def describe(self) -> str:
        controller = self.communication.removeprefix("horovod-")
        return f"Horovod rank {self.rank}/{self.world_size} on {self.device} ({controller})"


# --------------------------------------------------------------------------------------------
# Gloo controller under plain srun: what `horovodrun --gloo` would do, from SLURM_* instead.


def wants_slurm_gloo_rendezvous(env, environ) -> bool:
    """The rendered script asked for Gloo (HOROVOD_CONTROLLER=gloo) and srun, not horovodrun,
    started the ranks: nobody has set Horovod's rank variables or rendezvous yet."""
    return (environ.get("HOROVOD_CONTROLLER") == "gloo" and env.launcher == "slurm"
            and "HOROVOD_RANK" not in environ)


def slot_hostname(env, node_rank: int) -> str:
    return env.hosts[node_rank] if node_rank < len(env.hosts) else socket.gethostname()


def gloo_rendezvous(env, timeout_s: int) -> Any:
    """Export Horovod's rank variables from the DistEnv; rank 0 serves the HTTP rendezvous on
    MASTER_ADDR:MASTER_PORT (the job's port), the others wait until it answers.

    Returns rank 0's server (to shut down at the end), else None.
    """
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    view = env.horovod_view()
    os.environ.update({
        "HOROVOD_HOSTNAME": slot_hostname(env, env.node_rank),
        "HOROVOD_RANK": str(view["rank"]), "HOROVOD_SIZE": str(view["size"]),
        "HOROVOD_LOCAL_RANK": str(view["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(view["local_size"]),
        "HOROVOD_CROSS_RANK": str(view["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(view["cross_size"]),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": env.master_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(env.master_port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
    })
    iface = env.gloo_interface()
    if iface and "," not in iface:  # Horovod's Gloo takes one interface
        os.environ.setdefault("HOROVOD_GLOO_IFACE", iface)
    if env.rank != 0:
        _wait_for(env.master_addr, env.master_port, timeout_s)
        return None
    server = RendezvousHTTPServer(("", env.master_port), RendezvousHandler, 0)
    # The plan gives the size of each scope (global, local_HOST, cross_LOCALRANK), which the
    # server needs to know when every rank has finished with it.
    server.init([SlotInfo(hostname=slot_hostname(env, s["node_rank"]), rank=s["rank"],
                          local_rank=s["local_rank"], cross_rank=s["cross_rank"],
                          size=env.world_size, local_size=s["local_size"],
                          cross_size=s["cross_size"])
                 for s in distenv.horovod_slots(env.layout())])
    threading.Thread(target=server.serve_forever, name="horovod-rendezvous",
                     daemon=True).start()
    return server


def _wait_for(host: str, port: int, timeout_s: int) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise UsageError(
                    f"Horovod Gloo rendezvous at {host}:{port} (rank 0) did not answer within "
                    f"{timeout_s} s ({exc}); is rank 0 running, and the port open between nodes?"
                ) from None
            time.sleep(0.2)
