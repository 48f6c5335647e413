"""The runtime side of a strategy: one small class per implementation (the registry in
hpcdp/strategies.py names it).

A strategy owns the processes and devices: it sets up communication (`setup`), wraps the model
and optimizer (`wrap`), silences gradient sync on accumulation micro-steps (`no_sync`), averages
logged numbers over ranks (`mean`), and orders Horovod's synchronize around the GradScaler
(`prepare_unscale`, `optimizer_step_context`). The loop only calls these; it never asks which
strategy it runs. A new strategy is one file here plus one entry in hpcdp/strategies.py, whose
`implementation` names the class ("train.strategies.NAME:Class").
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import TYPE_CHECKING, Any

import torch

from hpcdp import strategies as registry
from hpcdp.errors import UsageError

if TYPE_CHECKING:
    from hpcdp.distenv import DistEnv


class Strategy:
    """Defaults: one process, no communication. Subclasses override what they change."""

    device: torch.device = torch.device("cpu")
    rank: int = 0
    world_size: int = 1
    communication: str = "none"
    """How gradients travel: none, gloo, nccl, horovod-mpi, horovod-gloo (for the metrics)."""
    devices_per_process: int = 1
    """Devices one process drives (DataParallel: every visible GPU)."""
    grad_comm: str = "none"
    """The precision gradients travel in (train.grad_comm), set before `wrap` for the
    strategies that send them; "none" where gradients never leave the process."""
    compute_dtype: str = "fp32"
    """The run's precision (fp32, bf16, fp16), set before `wrap`."""
    settings: Any = None
    """The experiment's train section (TrainConfig), set before `wrap`."""
    casts_parameters: bool = False
    """The wrapper computes in compute_dtype itself (FSDP's MixedPrecisionPolicy): the loop
    then runs no autocast."""
    compile_around_wrapper: bool = False
    """train.compile compiles the wrapped model (True) or the model before `wrap` (False)."""
    log: Any = print

    def __init__(self, log: Any = print) -> None:
        self.log = log

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup(self, env: DistEnv, timeout_s: int) -> None:
        raise NotImplementedError

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             accum_steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        return model, optimizer

    def before_checkpoint(self, optimizer: torch.optim.Optimizer) -> None:
        """Called on every rank before rank 0 reads the state it saves (ZeRO-1 gathers its
        optimizer's shards on rank 0 here)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The per-parameter optimizer state this rank holds (memory per rank)."""
        return optimizer.state

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Context for micro-steps whose gradients must not be communicated yet."""
        return contextlib.nullcontext()

    def mean(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average over ranks (for logged metrics; every rank must call it)."""
        return tensor

    def all_reduce_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over ranks in place, over the transport gradients use (the network
        baseline, train/allreduce.py). One process: nothing to do."""

    def comm_breakdown(self) -> dict[str, float] | None:
        """This step's gradient all-reduce as the strategy times it, where it does (DDP):
        `allreduce`, `exposed`, `window` (seconds), `bytes`, `calls`. Called once per step,
        after the step synchronised; it forgets what it returned."""
        return None

    def exposed_comm(self, phases: dict[str, float], comm: dict[str, float] | None
                     ) -> float | None:
        """Seconds of this step's gradient communication no computation hid; None where it is
        not measured. Default: one process communicates nothing, a true zero."""
        return 0.0

    def all_reduce_max_(self, tensor: torch.Tensor) -> None:
        """The element-wise maximum over ranks, in place (the probe takes each iteration's
        time as the slowest rank's). One process: nothing to do."""

    def prepare_unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Called after the last backward of a step, before unscaling and clipping."""

    def optimizer_step_context(self, optimizer: torch.optim.Optimizer
                               ) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def broadcast_object(self, obj: Any, name: str) -> Any:
        """Rank 0's `obj` on every rank. Every rank passes the same `name`, whatever its `obj`
        (Horovod matches collectives by name, so the name must not depend on the object)."""
        return obj

    def barrier(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def describe(self) -> str:
        """One line for the log: what runs where."""
        return f"rank {self.rank}/{self.world_size} on {self.device}"


def create(spec: registry.StrategySpec, log: Any = print) -> Strategy:
    """The runtime object of a registry record: its `implementation` ("module:Class")."""
    module, _, name = spec.implementation.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise UsageError(f"strategy {spec.name!r}: {spec.implementation} is not a "
                         "train.strategies.Strategy subclass")
    return cls(log=log)


def device_for(env: DistEnv) -> torch.device:
    """The device a process drives: cuda:(env.device_index of the visible GPUs), else the CPU
    (the same rule `hpcdp env` shows)."""
    n_gpus = torch.cuda.device_count()
    if not n_gpus:
        return torch.device("cpu")
    env.check_visible_devices(n_gpus, bound=bool(os.environ.get("CUDA_VISIBLE_DEVICES")))
    index = env.device_index(n_gpus)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
