"""Token data for training: `prepare` once, then `open_data` and `Batches` in every rank.

`prepare(exp)` tokenizes the corpus into a folder named by everything that decides its contents
(corpus, tokenizer, vocabulary, validation fraction), so different settings never collide and a
finished folder never changes. It writes to a temporary folder and renames it into place, and
takes a file lock so that jobs started together tokenize once; without the lock (a filesystem
that refuses flock) the rename alone still keeps the result whole.

Sampling is defined over the GLOBAL batch: micro-batch number p draws batch_size * world_size
start offsets from np.random.default_rng([seed, split_id, p]) and rank r takes its slice. One
process with batch 8 therefore sees exactly the samples that two ranks with batch 4 see together,
which makes the strategies comparable and their equivalence testable.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np

from hpcdp.config import Experiment
from hpcdp.errors import UsageError
from train import shards
from train.corpora import SYNTHETIC, Corpus, corpus_name, resolve_corpus
from train.tokenizer import (
    BPE_FILE,
    BPETokenizer,
    Tokenizer,
    expected_vocab_size,
    load_tokenizer,
    train_bpe,
)

SPLIT_IDS = {"train": 0, "val": 1}
META_FILE = "meta.json"
FORMAT_VERSION = 1
SPLIT_BLOCK = 1 << 18
"""The token stream is cut in blocks of this many tokens; the last val_fraction of each block is
validation. Every part of the corpus is represented in val, whatever the document sizes."""
WRITE_CHUNK = 1 << 20
"""Tokens buffered before they are written (bounds memory for big corpora)."""
SYNTHETIC_TOKENS = {"train": 1 << 20, "val": 1 << 16}
SYNTHETIC_SEED = 20220613  # fixed, so every rank and every run generates the same tokens


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def prepared_path(exp: Experiment) -> Path:
    """The folder `prepare` writes for this experiment's data settings (may not exist yet)."""
    d = exp.data
    vocab = expected_vocab_size(d.tokenizer, d.vocab_size)
    name = f"{corpus_name(d.corpus)}_{d.tokenizer}-{vocab}_val{d.val_fraction:g}"
    if d.text_field != "text":  # another field of the same files is another corpus
        name += f"_field-{hashlib.sha256(d.text_field.encode()).hexdigest()[:8]}"
    return Path(d.prepared_dir).expanduser() / name


# --------------------------------------------------------------------------------------------
# Preparation


def prepare(exp: Experiment, log: Callable[[str], None] = print) -> Path:
    """Tokenize exp.data.corpus into its prepared folder; return the folder.

    Idempotent (returns at once when the folder exists and matches the inputs), atomic (temp
    folder + rename) and safe when several processes call it at once.
    """
    d = exp.data
    vocab = expected_vocab_size(d.tokenizer, d.vocab_size)
    folder = prepared_path(exp)
    if d.corpus == SYNTHETIC:
        log("corpus 'synthetic' needs no preparation: its tokens are generated when opened")
        return folder
    if shards.is_shard_folder(d.corpus):
        log(f"corpus {d.corpus!r} is pre-tokenized .bin shards: nothing to prepare")
        return Path(d.corpus).expanduser()
    corpus = resolve_corpus(d.corpus, d.text_field)
    if (folder / META_FILE).exists():
        return _check_existing(folder, corpus, log)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _prepare_lock(folder, log):
        if (folder / META_FILE).exists():  # another process finished while we waited
            return _check_existing(folder, corpus, log)
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            _build(exp, corpus, vocab, tmp, log)
            won = publish(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not won:
        return _check_existing(folder, corpus, log)
    log(f"prepared {folder}")
    return folder


def publish(tmp: Path, folder: Path) -> bool:
    """Rename a finished temp folder into place. False when another process got there first
    (its folder is kept: preparation is deterministic, so the contents are the same)."""
    try:
        os.rename(tmp, folder)
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not (folder / META_FILE).exists():
        raise UsageError(
            f"{str(folder)!r} exists but is not a prepared folder (no {META_FILE}); delete it "
            "and run prepare again"
        )
    return False


@contextmanager
def _prepare_lock(folder: Path, log: Callable[[str], None]) -> Iterator[None]:
    # The lock only saves duplicate work; correctness comes from the atomic rename, so a
    # filesystem without flock (some NFS/Lustre mounts) just means both processes tokenize.
    path = folder.parent / f".{folder.name}.lock"
    try:
        handle = open(path, "a")
    except OSError:
        yield
        return
    with handle:
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"another process is preparing {folder}; waiting for it")
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield  # the lock goes with the file handle; the lock file stays (deleting it races)


def _check_existing(folder: Path, corpus: Corpus, log: Callable[[str], None]) -> Path:
    meta = read_meta(folder)
    if meta.get("inputs_fingerprint") != corpus.fingerprint():
        # Sizes or times changed (a reinstall, a copy): only a content change is a problem.
        if meta.get("sha256") != corpus.sha256():
            raise UsageError(
                f"prepared folder {str(folder)!r} was made from different files than "
                f"data.corpus now holds ({corpus.source}); delete that folder to prepare again"
            )
    log(f"already prepared: {folder} ({meta['n_train_tokens']} train, "
        f"{meta['n_val_tokens']} val tokens)")
    return folder


def read_meta(folder: Path) -> dict:
    try:
        return json.loads((folder / META_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {str(folder / META_FILE)!r} ({exc}); delete {str(folder)!r} "
                         "and run prepare again") from None


def _build(exp: Experiment, corpus: Corpus, vocab: int, tmp: Path,
           log: Callable[[str], None]) -> dict:
    d = exp.data
    start = time.monotonic()
    log(f"preparing corpus {d.corpus!r} ({len(corpus.files)} files) with tokenizer "
        f"{d.tokenizer!r} (vocab {vocab}) -> {tmp.parent}")
    if d.tokenizer == "bpe":
        tok: Tokenizer = train_bpe(corpus.documents(), vocab)
        tok.save(tmp / BPE_FILE)
        log(f"trained BPE tokenizer ({vocab} tokens) in {time.monotonic() - start:.1f} s")
    else:
        tok = load_tokenizer(d.tokenizer, vocab_size=vocab, gpt2_files=d.gpt2_files)
    dtype = token_dtype(vocab)
    writer = _SplitWriter(tmp, dtype, d.val_fraction)
    n_docs = 0
    for ids in _encoded(corpus, tok, log):
        writer.add(ids)
        n_docs += 1
    counts = writer.close()
    left_out = corpus.left_out()
    if left_out:  # once, here and in meta.json: nothing is dropped without a word
        log(f"prepare: left out of {d.corpus!r}: {left_out}")
    if counts["train"] == 0:
        raise UsageError(f"data.corpus {d.corpus!r} holds no text")
    meta = {
        "format": FORMAT_VERSION,
        "corpus": d.corpus,
        "corpus_name": corpus.name,
        "corpus_source": corpus.source,
        "tokenizer": d.tokenizer,
        "vocab_size": vocab,
        "dtype": dtype.name,
        "n_train_tokens": counts["train"],
        "n_val_tokens": counts["val"],
        "n_documents": n_docs,
        "n_files": len(corpus.files),
        "skipped": corpus.skipped(),
        "val_fraction": d.val_fraction,
        "split_block": SPLIT_BLOCK,
        "separator": list(tok.separator),
        "tokenizer_file": BPE_FILE if d.tokenizer == "bpe" else None,
        "gpt2_files": str(Path(d.gpt2_files).resolve()) if d.tokenizer == "gpt2" else None,
        "sha256": corpus.sha256(),
        "inputs_fingerprint": corpus.fingerprint(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - start, 2),
    }
    # meta.json last: a folder with meta.json is a finished one.
    (tmp / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    log(f"tokenized {n_docs} documents: {counts['train']} train + {counts['val']} val tokens "
        f"in {meta['seconds']} s")
    return meta


PARALLEL_FROM_BYTES = 4 << 20
"""Corpora smaller than this are tokenized in this process (a pool costs more than it saves)."""
_worker_tokenizer: Tokenizer | None = None


def prepare_workers(corpus_bytes: int) -> int:
    """Worker processes for tokenizing: every CPU this process may use (its Slurm task's, where
    the affinity mask says so), one per PARALLEL_FROM_BYTES of corpus at most."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, corpus_bytes // PARALLEL_FROM_BYTES))


def _init_worker(tok: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tok


def _encode(text: str, tok: Tokenizer | None = None) -> np.ndarray:
    tok = tok or _worker_tokenizer
    ids = tok.encode(text)
    ids.extend(tok.separator)
    return np.asarray(ids, dtype=np.int64)


def _encoded(corpus: Corpus, tok: Tokenizer, log: Callable[[str], None]) -> Iterator[np.ndarray]:
    """Every document's tokens plus the separator, in corpus order, from worker processes when
    the corpus is big enough (ordered map: the same files as one process writes), with a
    progress bar on stderr."""
    from tqdm import tqdm

    size = sum(path.stat().st_size for path in corpus.files)
    workers = prepare_workers(size)
    log(f"tokenizing {size / 1e6:.1f} MB with {workers} process(es)")
    tty = os.isatty(2)
    bar = tqdm(total=size, unit="B", unit_scale=True, desc="prepare",
               mininterval=1.0 if tty else 30.0, disable=not tty and size < PARALLEL_FROM_BYTES)
    try:
        if workers == 1:
            for text in corpus.documents():
                bar.update(len(text))
                yield _encode(text, tok)
            return
        # fork: the workers inherit the tokenizer as it is (nothing pickled, nothing reloaded).
        # Hugging Face tokenizers' own threads are off in forked children; say so, quietly.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(tok,)) as pool:
            yield from pool.imap(_encode, _counted(corpus.documents(), bar), chunksize=16)
    finally:
        bar.close()


def _counted(texts: Iterator[str], bar) -> Iterator[str]:
    for text in texts:
        bar.update(len(text))  # characters, against the files' bytes: near enough for a bar
        yield text


class _SplitWriter:
    """Streams tokens to train.bin / val.bin: the last val_fraction of every SPLIT_BLOCK tokens
    (and of the final partial block) goes to val. Holds at most a block plus one document."""

    def __init__(self, folder: Path, dtype: np.dtype, val_fraction: float,
                 block: int = SPLIT_BLOCK) -> None:
        self.dtype, self.val_fraction, self.block = dtype, val_fraction, block
        self.files = {s: open(folder / f"{s}.bin", "wb") for s in SPLIT_IDS}
        self.counts = {s: 0 for s in SPLIT_IDS}
        self.out: dict[str, list[np.ndarray]] = {s: [] for s in SPLIT_IDS}
        self.pending: list[np.ndarray] = []
        self.n_pending = 0

    def add(self, ids: np.ndarray) -> None:
        if len(ids) and (ids.min() < 0 or ids.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id out of range for {self.dtype}")
        self.pending.append(ids.astype(self.dtype))
        self.n_pending += len(ids)
        if self.n_pending >= self.block:
            buf = np.concatenate(self.pending)
            n_full = len(buf) - len(buf) % self.block
            for i in range(0, n_full, self.block):
                self._split(buf[i:i + self.block])
            rest = buf[n_full:]
            self.pending, self.n_pending = [rest], len(rest)

    def _split(self, chunk: np.ndarray) -> None:
        cut = len(chunk) - int(round(len(chunk) * self.val_fraction))
        self._emit("train", chunk[:cut])
        self._emit("val", chunk[cut:])

    def _emit(self, split: str, tokens: np.ndarray, flush: bool = False) -> None:
        if len(tokens):
            self.out[split].append(tokens)
            self.counts[split] += len(tokens)
        if flush or sum(len(t) for t in self.out[split]) >= WRITE_CHUNK:
            for t in self.out[split]:
                t.tofile(self.files[split])
            self.out[split] = []

    def close(self) -> dict[str, int]:
        if self.n_pending:
            self._split(np.concatenate(self.pending))
        for split, f in self.files.items():
            self._emit(split, np.empty(0, self.dtype), flush=True)
            f.flush()
            os.fsync(f.fileno())  # durable before the rename publishes the folder
            f.close()
        return dict(self.counts)


# --------------------------------------------------------------------------------------------
# Reading


@dataclass
class TokenData:
    """The token streams of one prepared folder (memory-mapped) or of the synthetic corpus."""

    vocab_size: int
    meta: dict
    folder: Path | None
    splits: dict[str, np.ndarray] = field(repr=False)

    def tokens(self, split: str) -> np.ndarray:
        if split not in SPLIT_IDS:
            raise ValueError(f"split {split!r}: valid: {', '.join(SPLIT_IDS)}")
        return self.splits[split]

    def tokenizer(self) -> Tokenizer:
        """The tokenizer that made these tokens (to decode samples)."""
        kind = self.meta["tokenizer"]
        if kind == "bpe" and self.folder is not None:
            return BPETokenizer.from_file(self.folder / BPE_FILE)
        return load_tokenizer(kind, vocab_size=self.vocab_size,
                              gpt2_files=self.meta.get("gpt2_files"))


def open_data(exp: Experiment) -> TokenData:
    """Open the prepared folder (memory-mapped, nothing read whole) or generate `synthetic`."""
    d = exp.data
    vocab = expected_vocab_size(d.tokenizer, d.vocab_size)
    if d.corpus == SYNTHETIC:
        dtype = token_dtype(vocab)
        splits = {
            split: np.random.default_rng([SYNTHETIC_SEED, sid]).integers(
                0, vocab, SYNTHETIC_TOKENS[split], dtype=np.int64).astype(dtype)
            for split, sid in SPLIT_IDS.items()
        }
        meta = {"corpus": SYNTHETIC, "tokenizer": d.tokenizer, "vocab_size": vocab,
                "dtype": dtype.name, "n_train_tokens": SYNTHETIC_TOKENS["train"],
                "n_val_tokens": SYNTHETIC_TOKENS["val"]}
        return TokenData(vocab, meta, None, splits)
    if shards.is_shard_folder(d.corpus):  # memory-mapped where they are, nothing copied
        streams = shards.open_shards(Path(d.corpus).expanduser(), vocab, d.tokenizer)
        meta = {"corpus": d.corpus, "tokenizer": d.tokenizer, "vocab_size": vocab,
                "dtype": streams["train"].dtype.name, "format": "shards",
                **{f"n_{split}_tokens": len(t) for split, t in streams.items()}}
        return TokenData(vocab, meta, None, streams)
    folder = prepared_path(exp)
    if not (folder / META_FILE).exists():
        raise UsageError(
            f"no prepared data at {str(folder)!r}; run: python -m train prepare --experiment "
            f"{exp.name} (with the same --set options)"
        )
    meta = read_meta(folder)
    if meta.get("vocab_size") != vocab or meta.get("tokenizer") != d.tokenizer:
        raise UsageError(
            f"prepared folder {str(folder)!r} holds {meta.get('tokenizer')} tokens of vocab "
            f"{meta.get('vocab_size')}, not {d.tokenizer} {vocab}; delete it and prepare again"
        )
    dtype = np.dtype(meta["dtype"])
    splits = {}
    for split in SPLIT_IDS:
        path = folder / f"{split}.bin"
        n = meta[f"n_{split}_tokens"]
        size = path.stat().st_size if path.exists() else -1
        if size != n * dtype.itemsize:
            raise UsageError(
                f"{str(path)!r} should hold {n} tokens ({n * dtype.itemsize} bytes) but has "
                f"{size} bytes; delete {str(folder)!r} and prepare again"
            )
        # np.memmap cannot map an empty file.
        splits[split] = np.memmap(path, dtype=dtype, mode="r") if n else np.empty(0, dtype)
    return TokenData(vocab, meta, folder, splits)


class Batches:
    """Random windows of seq_len + 1 tokens, sampled over the global batch.

    Micro-batch number p is micro-step m = p % accum_steps of optimizer step s = p //
    accum_steps. Step s draws batch_size * world_size * accum_steps start offsets from
    np.random.default_rng([seed, split_id, s]); micro-step m of rank r takes slot
    m * world_size + r (batch_size windows each) and reads only those windows. Sampling is with
    replacement (no epochs), so the stream depends only on (seed, split, step, global batch):
    resuming at position p continues it, and any split of one global batch into ranks and
    micro-steps (strong scaling) trains on the same samples at every step. With one micro-step
    (accum_steps 1) step and micro-batch are the same number.
    """

    def __init__(self, data: TokenData, split: Literal["train", "val"], seq_len: int,
                 batch_size: int, rank: int, world_size: int, seed: int,
                 accum_steps: int = 1) -> None:
        if split not in SPLIT_IDS:
            raise ValueError(f"split {split!r}: valid: {', '.join(SPLIT_IDS)}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        if seq_len < 1 or batch_size < 1 or accum_steps < 1:
            raise ValueError(f"seq_len {seq_len}, batch_size {batch_size} and accum_steps "
                             f"{accum_steps} must be >= 1")
        if seed < 0:
            raise UsageError(f"train.seed {seed} must be >= 0")
        self.tokens = data.tokens(split)
        if len(self.tokens) < seq_len + 1:
            where = data.folder or "the synthetic corpus"
            raise UsageError(
                f"the {split} split of {where} has {len(self.tokens)} tokens, fewer than "
                f"train.seq_len + 1 = {seq_len + 1}; use a bigger corpus, a shorter seq_len"
                + (" or a larger data.val_fraction" if split == "val" else "")
            )
        self.split, self.seq_len, self.batch_size = split, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.accum_steps = accum_steps
        self.position = 0

    def starts(self, position: int) -> np.ndarray:
        """This rank's window starts for micro-batch `position`."""
        step, micro = divmod(position, self.accum_steps)
        rng = np.random.default_rng([self.seed, SPLIT_IDS[self.split], step])
        # high is exclusive: the last start leaves room for seq_len + 1 tokens.
        every = rng.integers(0, len(self.tokens) - self.seq_len,
                             size=self.batch_size * self.world_size * self.accum_steps)
        slot = micro * self.world_size + self.rank
        return every[slot * self.batch_size:(slot + 1) * self.batch_size]

    def next_batch(self):
        """(x, y) LongTensors of shape [batch_size, seq_len]; y is x shifted by one token."""
        import torch  # here, so that `python -m train prepare` never pays for importing torch

        rows = np.stack([
            np.asarray(self.tokens[s:s + self.seq_len + 1], dtype=np.int64)
            for s in self.starts(self.position)
        ])
        self.position += 1
        x = torch.from_numpy(np.ascontiguousarray(rows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(rows[:, 1:]))
        return x, y

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
