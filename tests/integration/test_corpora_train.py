"""Real pre-training data formats train end to end (issue 12, item 4): a JSONL corpus, a Parquet
corpus and a folder of llm.c .bin shards, each made here, prepared (or not: shards need nothing)
and trained for a few steps by `python -m train`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (20 + i % 7)
         for i in range(200)]


def make_jsonl(folder: Path) -> Path:
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)))
    return path


def make_parquet(folder: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = folder / "corpus.parquet"
    pq.write_table(pa.table({"text": TEXTS}), path)
    return path


def make_shards(folder: Path) -> Path:
    shard_dir = folder / "shards"
    shard_dir.mkdir()
    stream = np.frombuffer("".join(TEXTS).encode(), dtype=np.uint8).astype(np.uint16)
    for name, part in (("c_train_000000.bin", stream[:40_000]), ("c_train_000001.bin",
                       stream[40_000:-5_000]), ("c_val_000000.bin", stream[-5_000:])):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = [20240520, 1, len(part)]
        (shard_dir / name).write_bytes(header.tobytes() + part.tobytes())
    return shard_dir


@pytest.mark.parametrize("make", [make_jsonl, make_parquet, make_shards])
def test_each_corpus_format_prepares_and_trains(tmp_path, make):
    corpus = make(tmp_path)
    sets = [f"data.corpus={corpus}", "data.tokenizer=bytes", f"data.prepared_dir={tmp_path}/p",
            "train.steps=6", "train.log_interval=1", "train.eval_interval=0",
            "train.checkpoint_interval=0", "train.seq_len=64"]
    args = [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    prepared = subprocess.run([sys.executable, "-m", "train", "prepare", "--experiment", "smoke",
                               *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    if make is make_shards:
        assert "nothing to prepare" in prepared.stdout
        assert not (tmp_path / "p").exists()
    trained = subprocess.run([sys.executable, "-m", "train", "--experiment", "smoke",
                              "--strategy", "single-gpu", "--out", str(tmp_path / "run"), *args],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r["kind"] == "step"]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert records[-1]["kind"] == "summary" and records[-1]["status"] == "completed"
