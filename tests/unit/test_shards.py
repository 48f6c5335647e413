"""train/shards.py: nanoGPT and llm.c .bin shards, memory-mapped where they are, one stream per
split across shard boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.config import DataConfig, Experiment
from hpcdp.errors import UsageError
from train import shards
from train.data import Batches, open_data, prepare


def llmc(path, tokens, version=1, count=None):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [shards.LLMC_MAGIC, version, len(tokens) if count is None else count]
    dtype = np.uint16 if version == 1 else np.uint32
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype=dtype).tobytes())
    return path


def exp_for(folder, tokenizer="bytes") -> Experiment:
    return Experiment(name="t", data=DataConfig(corpus=str(folder), tokenizer=tokenizer))


def test_llmc_shards_are_one_stream_per_split_across_boundaries(tmp_path):
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 50257, n) for n in (1000, 700, 300)]
    for i, part in enumerate(parts[:2]):
        llmc(tmp_path / f"fineweb_train_{i:06d}.bin", part)
    llmc(tmp_path / "fineweb_val_000000.bin", parts[2])
    (tmp_path / "README.json").write_text("{}")  # metadata beside shards is fine
    exp = exp_for(tmp_path, tokenizer="gpt2")
    assert prepare(exp, log=lambda _: None) == tmp_path  # nothing to prepare
    data = open_data(exp)
    train = data.tokens("train")
    assert len(train) == 1700 and len(data.tokens("val")) == 300
    assert all(isinstance(s, np.memmap) for s in train.shards)  # mapped, not copied
    whole = np.concatenate(parts[:2])
    for start, stop in ((0, 10), (990, 1010), (995, 1700), (1699, 1700)):
        assert np.array_equal(train[start:stop], whole[start:stop])
    x, y = Batches(data, "train", 64, 4, 0, 1, seed=3).next_batch()
    assert x.shape == (4, 64) and np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())


def test_nanogpt_raw_shards_and_uint32_llmc_shards(tmp_path):
    (tmp_path / "train.bin").write_bytes((np.arange(500) % 256).astype(np.uint16).tobytes())
    (tmp_path / "val.bin").write_bytes(np.arange(200, dtype=np.uint16).tobytes())
    data = open_data(exp_for(tmp_path))
    assert data.meta["n_train_tokens"] == 500 and data.tokens("val")[198:200].tolist() == [198, 199]
    big = tmp_path / "v2"
    big.mkdir()
    llmc(big / "x_train.bin", [70000, 1, 2], version=2)
    llmc(big / "x_val.bin", [3, 4], version=2)
    assert open_shards_list(big) == [70000, 1, 2]


def open_shards_list(folder):
    return shards.open_shards(folder, 128256)["train"][0:3].tolist()


@pytest.mark.parametrize("make, problem", [
    (lambda d: llmc(d / "a_train.bin", [1, 2, 3], count=5), "header says 5 tokens, the file "
                                                              "holds 3"),
    (lambda d: llmc(d / "a_train.bin", [1, 2], version=7), "llm.c version 7, valid: 1"),
    (lambda d: (d / "train.bin").write_bytes(b"\x01\x02\x03"), "3 bytes is not a whole number"),
])
def test_broken_shards_are_one_line_errors(tmp_path, make, problem):
    make(tmp_path)
    llmc(tmp_path / "a_val.bin", [1, 2])
    with pytest.raises(UsageError, match=problem):
        open_data(exp_for(tmp_path))


def test_a_shard_folder_without_validation_shards_says_how_they_are_named(tmp_path):
    llmc(tmp_path / "only_train.bin", [1, 2, 3])
    with pytest.raises(UsageError, match="no val tokens .*name holds 'val'"):
        open_data(exp_for(tmp_path))
    assert not shards.is_shard_folder(str(tmp_path / "missing"))
    (tmp_path / "notes.txt").write_text("text")
    assert not shards.is_shard_folder(str(tmp_path))  # a text corpus, to prepare


def test_ids_past_the_vocabulary_are_refused_when_the_shards_open(tmp_path):
    # issue 19, item 5: nanoGPT uint16 shards of GPT-2 ids under the default bytes tokenizer
    (tmp_path / "train.bin").write_bytes(np.array([10, 50256, 3], dtype=np.uint16).tobytes())
    (tmp_path / "val.bin").write_bytes(np.array([1, 2], dtype=np.uint16).tobytes())
    with pytest.raises(UsageError) as caught:
        open_data(exp_for(tmp_path))
    message = str(caught.value)
    assert "token id 50,256" in message and "data.tokenizer 'bytes'" in message
    assert "vocabulary of 256" in message and "\n" not in message
    assert shards.largest_id(np.arange(10, dtype=np.uint16)) == 9
