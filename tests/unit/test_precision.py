"""train/precision.py: dtype choice, autocast, and the GradScaler path through the real step.

The fp16 tests run the loop's own `train_step` on a tiny GPT-2 on the CPU (GradScaler('cpu')
works), with AdamW fused and not: an inf injected into one gradient must make the scaler skip
the step (parameters bit-identical), halve the scale, and report the step as skipped.
"""

from __future__ import annotations

import pytest
import torch

from hpcdp import strategies
from hpcdp.config import load_experiment
from hpcdp.distenv import detect
from hpcdp.errors import UsageError
from train.data import Batches, open_data
from train.loop import make_optimizer, train_step
from train.model import LanguageModel, build_model
from train.precision import Precision, make_precision, resolve_dtype
from train.strategies import create


@pytest.mark.parametrize(("mixed", "amp_dtype", "device", "expected"), [
    (False, "auto", "cuda", "fp32"),
    (False, "fp16", "cpu", "fp32"),
    (True, "auto", "cuda", "fp16"),
    (True, "auto", "cpu", "bf16"),
    (True, "fp16", "cpu", "fp16"),
    (True, "bf16", "cuda", "bf16"),
])
def test_resolve_dtype(mixed: bool, amp_dtype: str, device: str, expected: str) -> None:
    assert resolve_dtype(mixed, amp_dtype, device) == expected


def test_fp32_is_a_no_op() -> None:
    precision = make_precision(False, "auto", "native", "cpu")
    assert precision.name == "fp32" and not precision.uses_scaler
    assert precision.loss_scale() is None
    with precision.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.float32


def test_bf16_autocasts_matmuls_and_needs_no_scaler() -> None:
    precision = make_precision(True, "auto", "native", "cpu")
    assert precision.name == "bf16" and not precision.uses_scaler
    with precision.autocast():
        out = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16


def test_apex_on_cpu_is_a_usage_error_pointing_at_native_amp() -> None:
    with pytest.raises(UsageError, match="native"):
        make_precision(True, "auto", "apex", "cpu")
    with pytest.raises(UsageError, match="fp16 only"):  # refused when the experiment loads
        load_experiment("smoke", {"train": {"amp_backend": "apex", "amp_dtype": "bf16"}})
    # A plain strategy in a matrix that uses apex for its -apex cells trains in fp32.
    assert make_precision(False, "auto", "apex", "cpu").name == "fp32"


def _setup(precision: Precision, fused: bool):
    exp = load_experiment("smoke", {"data": {"corpus": "synthetic"},
                                    "train": {"micro_batch_size": 2, "seq_len": 32}})
    strategy = create(strategies.get("single-gpu"))
    strategy.setup(detect({}), 60)
    torch.manual_seed(0)
    raw = build_model("tiny", 256, 32)
    model = LanguageModel(raw)
    optimizer = make_optimizer(model, exp, strategy.device, fused=fused)
    batches = Batches(open_data(exp), "train", 32, 2, 0, 1, 0)
    return raw, model, optimizer, batches, strategy


def _step(model, optimizer, batches, strategy, precision):
    return train_step(model, optimizer, batches, strategy, precision, accum_steps=2,
                      grad_clip=1.0, lr=1e-3)


@pytest.mark.parametrize("fused", [True, False])
def test_fp16_step_with_non_finite_gradients_is_skipped_and_the_scale_halved(fused: bool) -> None:
    precision = make_precision(True, "fp16", "native", "cpu")
    assert precision.uses_scaler
    raw, model, optimizer, batches, strategy = _setup(precision, fused)
    scale = precision.loss_scale()
    before = {k: v.clone() for k, v in raw.state_dict().items()}

    hook = raw.transformer.h[0].mlp.c_fc.weight.register_hook(lambda g: g * float("inf"))
    result = _step(model, optimizer, batches, strategy, precision)
    hook.remove()
    assert result.skipped is True
    assert not torch.isfinite(result.grad_norm)
    assert precision.loss_scale() == scale / 2
    after = raw.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step changed weights"

    result = _step(model, optimizer, batches, strategy, precision)
    assert result.skipped is False and torch.isfinite(result.grad_norm)
    assert precision.loss_scale() == scale / 2  # grows only after 2000 good steps
    after = raw.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_fp16_gradients_are_unscaled_before_clipping() -> None:
    """Unscaling happens before clipping: the clipped norm is the true one, not scale x it."""
    precision = make_precision(True, "fp16", "native", "cpu")
    raw, model, optimizer, batches, strategy = _setup(precision, fused=True)
    result = _step(model, optimizer, batches, strategy, precision)
    assert not result.skipped
    # An unscaled gradient norm of a fresh tiny GPT-2 is of order 1, far from 65536 x that.
    assert 0.01 < result.grad_norm.item() < 100
