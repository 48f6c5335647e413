"""GPT-2 from transformers, randomly initialised, plus the loss wrapper every strategy trains.

`build_model` returns a plain `GPT2LMHeadModel` (checkpoints hold its state dict, so a trained
model can be loaded back into transformers). The loop trains `LanguageModel(model)`, whose forward
returns the loss: under DataParallel each replica computes its own loss and only scalars are
gathered, instead of full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hpcdp.config import MODEL_PRESETS, model_context
from hpcdp.errors import UsageError
from hpcdp.peaks import training_flops_per_token


def build_model(
    preset: str, vocab_size: int, seq_len: int, dropout: float = 0.0, attention: str = "sdpa"
) -> GPT2LMHeadModel:
    """A randomly initialised GPT-2 (seed torch before calling for identical weights).

    The arguments come from a loaded Experiment, which already checked the preset and that
    seq_len fits its context (hpcdp/config.py validates once)."""
    n_layer, n_embd, n_head, _ = MODEL_PRESETS[preset]
    n_positions = model_context(preset, seq_len)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        # GPT-2's end-of-text id is its last token; keep that true for small vocabularies.
        bos_token_id=vocab_size - 1,
        eos_token_id=vocab_size - 1,
    )
    config._attn_implementation = attention
    return GPT2LMHeadModel(config)


def load_weights(model: GPT2LMHeadModel, state: dict[str, torch.Tensor], where: str) -> None:
    """Load `state` into `model`, every name checked (the head is tied to the token embedding,
    so a state without lm_head.weight is whole); one line naming what differs otherwise."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise UsageError(f"{where} does not hold this GPT-2: missing {missing[:3] or 'none'}, "
                         f"unexpected {unexpected[:3] or 'none'}")
    model.tie_weights()


def count_params(model: nn.Module, *, with_position_embeddings: bool = True) -> int:
    """Parameters counted once (GPT-2 ties the input embedding and the output head)."""
    n = sum(p.numel() for p in model.parameters())
    if not with_position_embeddings:
        n -= model.transformer.wpe.weight.numel()
    return n


def flops_per_token(model: GPT2LMHeadModel, seq_len: int) -> int:
    """Training FLOPs per token of the built model (hpcdp/peaks.py's count)."""
    cfg = model.config
    return training_flops_per_token(count_params(model, with_position_embeddings=False),
                                    cfg.n_layer, cfg.n_embd, seq_len)


class LanguageModel(nn.Module):
    """forward(x, y) -> mean next-token cross-entropy, shape [1] (y is x shifted by one, done
    by the data). Shape [1], not a scalar: DataParallel concatenates one per GPU without
    warning, and the loop takes the mean either way."""

    def __init__(self, model: GPT2LMHeadModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=x).logits
        # cross_entropy runs in fp32 under autocast (it is on autocast's fp32 list).
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).reshape(1)
