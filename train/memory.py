"""Memory per rank: the reason to shard, so every run measures it.

Two views, both per rank and taken as the largest over ranks (the rank that runs out first):
- the peak the process reached: torch.cuda.max_memory_allocated on a GPU (the caching
  allocator's own count, what torchtitan reports); on a CPU the peak resident set size
  (getrusage's ru_maxrss: the interpreter, torch's libraries and every buffer, so read it as
  a comparison between strategies of one run setup, not as the model's size);
- the bytes of model state the rank holds: parameters, gradients and optimizer state (a
  sharded strategy holds its shard: a DTensor's local part).
"""

from __future__ import annotations

import resource
from typing import Any

import torch

# The state counted, in the order of the all-reduce.
STATE = ("params_bytes", "grads_bytes", "optimizer_bytes")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank; any other tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _nbytes(tensors) -> int:
    local = [_local(t) for t in tensors if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in local)


def state_bytes(model: torch.nn.Module, optimizer_state: dict) -> dict[str, int]:
    """Parameters, gradients and optimizer state (moments, steps) this rank holds. Gradients
    are freed after each step (zero_grad sets them to None), so they count as a step holds
    them: one per trainable parameter, as large as its local part (DDP's buckets, a copy,
    are in the peak but not here)."""
    params = list(model.parameters())
    opt_tensors = [v for state in optimizer_state.values() for v in state.values()]
    return {"params_bytes": _nbytes(params),
            "grads_bytes": _nbytes(p for p in params if p.requires_grad),
            "optimizer_bytes": _nbytes(opt_tensors)}


def peak_bytes(device: torch.device) -> tuple[int, str]:
    """This process's peak memory so far, and what was measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak_rss"  # KiB on Linux


def summary(model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Any,
            device: torch.device) -> dict[str, Any]:
    """The summary's `memory`: each figure the largest over ranks. Every rank must call it
    (one all-reduce of four numbers)."""
    peak, measured = peak_bytes(device)
    state = state_bytes(model, strategy.optimizer_state(optimizer))
    values = torch.tensor([float(peak), *(float(state[k]) for k in STATE)], dtype=torch.float64,
                          device=device)
    strategy.all_reduce_max_(values)
    peak_max, *state_max = (int(v) for v in values.tolist())
    return {"measured": measured, "peak_bytes": peak_max,
            **dict(zip(STATE, state_max))}
