"""Mixed precision as a field, not a strategy.

`Precision` gives the loop an autocast context and a scaler-shaped object; with fp32 both are
no-ops (nullcontext, a disabled GradScaler), so the train step never branches on precision.
Native AMP (torch.autocast + torch.amp.GradScaler) is the default; NVIDIA apex.amp is a legacy
back-end, usable only where a CUDA build of apex <= 25.05 is importable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hpcdp.errors import UsageError

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_dtype(mixed: bool, amp_dtype: str, device_type: str) -> str:
    """'fp32', 'fp16' or 'bf16' for a strategy's mixed_precision flag and train.amp_dtype."""
    if not mixed:
        return "fp32"
    if amp_dtype == "auto":
        # fp16 is what the paper's V100s do fast; on CPU autocast is only fast in bf16.
        return "fp16" if device_type == "cuda" else "bf16"
    return amp_dtype  # auto, fp16 or bf16: checked when the experiment loaded


@dataclass
class Precision:
    """Native AMP: autocast + GradScaler (disabled for fp32 and bf16)."""

    name: str  # fp32 / fp16 / bf16
    device_type: str
    backend: str = "native"
    scaler: torch.amp.GradScaler = field(init=False)
    use_autocast: bool = True
    """False where the strategy computes in the low precision itself (FSDP's parameters)."""

    def __post_init__(self) -> None:
        # bf16 has fp32's exponent range: no loss scaling needed.
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.name == "fp16")

    @property
    def uses_scaler(self) -> bool:
        return self.scaler.is_enabled()

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32" or not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.name])

    def initialize(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        """Back-ends that rewrite model and optimizer (apex) do it here; native does nothing."""
        return model, optimizer

    def backward(self, loss: torch.Tensor, optimizer: Any, *, last: bool,
                 before_unscale: Callable[[], None]) -> None:
        """Backward of one micro-batch; after the last one, gradients are synchronized
        (`before_unscale`, Horovod's synchronize) and then unscaled, ready for clipping."""
        self.scaler.scale(loss).backward()
        if last:
            before_unscale()
            # FSDP's sharded gradients need no agreement here: DTensor reduces unscale_'s
            # found-inf flag with MAX over the shards (tests/unit/test_sharded_overflow.py).
            self.scaler.unscale_(optimizer)

    def master_params(self, optimizer: Any) -> Iterator[torch.Tensor]:
        for group in optimizer.param_groups:
            yield from group["params"]

    def step(self, optimizer: Any) -> bool:
        """Optimizer step through the scaler; True when it was skipped (inf/nan gradients)."""
        if not self.uses_scaler:
            optimizer.step()
            return False
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        # GradScaler skips the step and backs the scale off exactly when it found inf/nan.
        return self.scaler.get_scale() < before

    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.uses_scaler else None

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.uses_scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.uses_scaler and state:
            self.scaler.load_state_dict(state)


class ApexPrecision(Precision):
    """Legacy NVIDIA apex.amp (O1/O2), as the paper used it. CUDA only, apex <= 25.05."""

    def __init__(self, name: str, device_type: str, opt_level: str) -> None:
        self.name, self.device_type, self.backend = name, device_type, "apex"
        self.opt_level = opt_level
        self.amp = _import_apex_amp(device_type)
        # apex keeps its own loss scaler; ours stays off so uses_scaler reports False.
        self.scaler = torch.amp.GradScaler(device_type, enabled=False)

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # apex patches the model's functions (O1) or casts it (O2)

    def initialize(self, model: Any, optimizer: Any) -> tuple[Any, Any]:
        return self.amp.initialize(model, optimizer, opt_level=self.opt_level, verbosity=0)

    def backward(self, loss: torch.Tensor, optimizer: Any, *, last: bool,
                 before_unscale: Callable[[], None]) -> None:
        # apex unscales when scale_loss exits: Horovod must synchronize inside the block.
        with self.amp.scale_loss(loss, optimizer, delay_unscale=not last) as scaled:
            scaled.backward()
            if last:
                before_unscale()

    def master_params(self, optimizer: Any) -> Iterator[torch.Tensor]:
        return self.amp.master_params(optimizer)

    def step(self, optimizer: Any) -> bool:
        optimizer.step()  # apex skips it itself on overflow
        return False

    def loss_scale(self) -> float | None:
        scalers = getattr(self.amp._amp_state, "loss_scalers", None)
        return float(scalers[0].loss_scale()) if scalers else None

    def state_dict(self) -> dict:
        return self.amp.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.amp.load_state_dict(state)


def _import_apex_amp(device_type: str) -> Any:
    if device_type != "cuda":
        raise UsageError(
            "train.amp_backend 'apex' needs CUDA GPUs (apex.amp refuses CPU tensors); "
            "use train.amp_backend=native (the default: torch.autocast + GradScaler)"
        )
    try:
        from apex import amp  # type: ignore[import-not-found]
    except ImportError:
        raise UsageError(
            "train.amp_backend 'apex' needs NVIDIA apex <= 25.05 built with CUDA (apex.amp was "
            "removed in May 2025), which is not importable here; use train.amp_backend=native "
            "(the default: torch.autocast + GradScaler)"
        ) from None
    if not hasattr(amp, "initialize"):
        raise UsageError("the installed apex has no apex.amp (removed after 25.05); "
                         "use train.amp_backend=native (the default)")
    return amp


def make_precision(mixed: bool, amp_dtype: str, amp_backend: str, device_type: str,
                   apex_opt_level: str = "O1") -> Precision:
    """The precision of a run: strategy.mixed_precision + train.amp_dtype / amp_backend (their
    values and combination were checked when the experiment loaded)."""
    name = resolve_dtype(mixed, amp_dtype, device_type)
    # Plain strategies train in fp32 whatever the back-end of mixed precision is (a matrix
    # may hold both kinds under one train.amp_backend).
    if amp_backend == "apex" and mixed:
        return ApexPrecision("fp16", device_type, apex_opt_level)
    return Precision(name, device_type)
