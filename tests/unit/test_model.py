"""train/model.py: presets, context limits, FLOPs per token, and the loss the loop trains."""

from __future__ import annotations

import pytest
import torch

from hpcdp.config import load_experiment
from hpcdp.errors import UsageError
from train.model import LanguageModel, build_model, count_params, flops_per_token


def test_tiny_preset_shape_and_context_grows_with_seq_len() -> None:
    model = build_model("tiny", vocab_size=256, seq_len=64)
    cfg = model.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions) == (2, 128, 4, 128)
    assert cfg._attn_implementation == "sdpa"
    assert build_model("tiny", 256, seq_len=300).config.n_positions == 300


def test_paper_preset_is_about_100m_parameters_with_the_papers_vocabulary() -> None:
    # The paper: 12 layers, width 768, context 512, a ~26.7k character vocabulary -> ~106M.
    with torch.device("meta"):
        model = build_model("gpt2-100m", vocab_size=26_700, seq_len=512)
    assert model.config.n_positions == 512
    assert 100e6 < count_params(model) < 110e6


def test_gpt2_124m_has_the_standard_count() -> None:
    with torch.device("meta"):
        model = build_model("gpt2-124m", vocab_size=50_257, seq_len=1024)
    assert count_params(model) == 124_439_808  # GPT-2 small, tied embeddings


@pytest.mark.parametrize(("preset", "vocab", "seq_len"), [
    ("tiny", 256, 128), ("tiny", 50_257, 300), ("gpt2-100m", 26_700, 512),
    ("gpt2-124m", 50_257, 1024)])
def test_forecast_shapes_are_the_models_parameters_in_order(preset, vocab, seq_len) -> None:
    """hpcdp/forecast/model.py's GPT-2 shapes stand in for the model where transformers is not
    loaded: the forecast's state per rank, and the network probe's gradient size
    (train/allreduce.py)."""
    from hpcdp.config import MODEL_PRESETS, model_context
    from hpcdp.forecast import gpt2_shapes
    from train.allreduce import gradient_elements

    n_layer, n_embd, _, _ = MODEL_PRESETS[preset]
    with torch.device("meta"):
        model = build_model(preset, vocab, seq_len)
    shapes = gpt2_shapes(n_layer, n_embd, vocab, model_context(preset, seq_len))
    assert shapes == [tuple(p.shape) for p in model.parameters()]
    data = {256: {"tokenizer": "bytes"}, 50_257: {"tokenizer": "gpt2"}}.get(
        vocab, {"tokenizer": "bpe", "vocab_size": vocab})
    exp = load_experiment("smoke", {"model": {"preset": preset}, "train": {"seq_len": seq_len},
                                    "data": data})
    assert gradient_elements(exp) == count_params(model)


@pytest.mark.parametrize(("preset", "seq_len"), [("gpt2-100m", 1024), ("tiny", 1025)])
def test_seq_len_beyond_the_context_is_refused_when_the_experiment_loads(preset, seq_len):
    with pytest.raises(UsageError, match=f"train.seq_len {seq_len}"):
        load_experiment("smoke", {"model": {"preset": preset}, "train": {"seq_len": seq_len}})


def test_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(UsageError, match="gpt2-124m"):
        load_experiment("smoke", {"model": {"preset": "gpt3"}})


def test_flops_per_token_is_6n_plus_attention() -> None:
    model = build_model("tiny", 256, 128)
    n_without_wpe = count_params(model) - 128 * 128
    assert count_params(model, with_position_embeddings=False) == n_without_wpe
    assert flops_per_token(model, 128) == 6 * n_without_wpe + 12 * 2 * 128 * 128


@pytest.mark.parametrize("preset, tokenizer, seq_len", [
    ("tiny", "bytes", 64), ("tiny", "gpt2", 300), ("gpt2-124m", "gpt2", 1024)])
def test_the_estimate_counts_the_flops_the_trainer_counts(preset, tokenizer, seq_len) -> None:
    """One answer (issue 47): the estimate before submitting, without transformers, and the
    trainer's MFU from the built model."""
    from hpcdp import estimate
    from hpcdp.config import vocab_size_of

    exp = load_experiment("smoke", {"model": {"preset": preset}, "data": {"tokenizer": tokenizer},
                                    "train": {"seq_len": seq_len}})
    with torch.device("meta"):
        model = build_model(preset, vocab_size_of(exp), seq_len)
    assert estimate.flops_per_token(exp) == flops_per_token(model, seq_len)


def test_loss_is_next_token_cross_entropy_as_transformers_computes_it() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", 256, 32)
    tokens = torch.randint(0, 256, (3, 33))
    x, y = tokens[:, :-1], tokens[:, 1:]
    ours = LanguageModel(model)(x, y)
    # transformers shifts the labels itself: with input x and labels x it predicts x[1:]
    # from x[:-1], dropping the last prediction. Ours (x, y) scores that last one too.
    theirs = model(input_ids=x, labels=x).loss
    logits = model(input_ids=x).logits
    last = torch.nn.functional.cross_entropy(logits[:, -1], y[:, -1], reduction="sum")
    n = x.numel()  # 3 x 32 targets in ours, 3 x 31 in theirs
    expected = (theirs * (n - 3) + last) / n
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_same_seed_same_weights() -> None:
    torch.manual_seed(5)
    a = build_model("tiny", 256, 64).state_dict()
    torch.manual_seed(5)
    b = build_model("tiny", 256, 64).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
