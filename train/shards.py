"""Pre-tokenized corpora: a folder of nanoGPT or llm.c `.bin` shards, memory-mapped as they are.

`data.corpus` naming a folder whose data files are all `.bin` needs no `prepare`. Shards whose
name holds `val` make the validation split, the others the training split (nanoGPT's
train.bin + val.bin; llm.c's fineweb_train_000001.bin ..., fineweb_val_000000.bin). Two layouts:

- llm.c: a header of 256 int32 (magic 20240520, version 1 for uint16 tokens or 2 for uint32,
  the token count), then the tokens;
- nanoGPT (no header): raw tokens, uint16 below 65,536 vocabulary entries, else uint32.

A split of several shards is one stream (`ShardedTokens`): a window that crosses a shard's end
continues in the next, and nothing is read until a batch asks for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdp.errors import UsageError

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256
LLMC_DTYPES = {1: np.dtype(np.uint16), 2: np.dtype(np.uint32)}


class ShardedTokens:
    """Shards read as one token stream: len() and [start:stop] slices, as Batches uses them."""

    def __init__(self, shards: list[np.ndarray]) -> None:
        self.shards = [s for s in shards if len(s)]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.dtype = self.shards[0].dtype if self.shards else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, window: slice) -> np.ndarray:
        start, stop, step = window.indices(len(self))
        if step != 1:
            raise ValueError("ShardedTokens takes contiguous windows only")
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces, at = [], start
        for i in range(first, len(self.shards)):
            if at >= stop:
                break
            offset = at - int(self.starts[i])
            piece = self.shards[i][offset:offset + (stop - at)]
            pieces.append(piece)
            at += len(piece)
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, self.dtype)


def is_shard_folder(spec: str) -> bool:
    """A folder holding .bin files and no text corpus files."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return False
    data = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() != ".json"]
    return bool(data) and all(p.suffix == ".bin" for p in data)


def open_shard(path: Path, vocab: int) -> np.ndarray:
    """One shard, memory-mapped past its header (llm.c) or whole (nanoGPT)."""
    with path.open("rb") as f:
        raw = f.read(LLMC_HEADER_INTS * 4)
    head = np.frombuffer(raw, dtype=np.int32) if len(raw) == LLMC_HEADER_INTS * 4 else None
    size = path.stat().st_size
    if head is not None and head[0] == LLMC_MAGIC:
        version, count = int(head[1]), int(head[2])
        if version not in LLMC_DTYPES:
            raise UsageError(f"shard {str(path)!r}: llm.c version {version}, valid: 1 (uint16) "
                             "or 2 (uint32)")
        dtype, offset = LLMC_DTYPES[version], LLMC_HEADER_INTS * 4
        if size != offset + count * dtype.itemsize:
            raise UsageError(f"shard {str(path)!r}: its header says {count} tokens, the file "
                             f"holds {(size - offset) // dtype.itemsize}; is it whole?")
    else:
        dtype, offset = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32), 0
        if size % dtype.itemsize:
            raise UsageError(f"shard {str(path)!r}: {size} bytes is not a whole number of "
                             f"{dtype.name} tokens")
        count = size // dtype.itemsize
    if count == 0:
        return np.empty(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


MAX_ID_CHUNK = 1 << 26  # tokens read at a time when checking ids: bounded memory


def largest_id(tokens: np.ndarray) -> int:
    """The largest token id of a shard, read once in chunks (a shard is often GBs)."""
    return max((int(tokens[i:i + MAX_ID_CHUNK].max()) for i in range(0, len(tokens),
                                                                      MAX_ID_CHUNK)), default=0)


def check_ids(path: Path, tokens: np.ndarray, vocab: int, tokenizer: str) -> None:
    """Ids at or past the vocabulary would index past the embedding (an IndexError on a CPU, a
    device-side assert on a GPU, deep in the first forward): refuse them when the shard opens."""
    top = largest_id(tokens)
    if top >= vocab:
        raise UsageError(f"shard {str(path)!r} holds token id {top:,}, but data.tokenizer "
                         f"{tokenizer!r} has a vocabulary of {vocab:,}: set data.tokenizer to "
                         "the one the shards were made with (nanoGPT/llm.c: gpt2)")


def open_shards(folder: Path, vocab: int, tokenizer: str = "?") -> dict[str, ShardedTokens]:
    """{"train": ..., "val": ...} of a shard folder; both splits must have tokens, and every id
    must be below the vocabulary."""
    files = sorted(p for p in folder.iterdir() if p.suffix == ".bin")
    splits = {"train": [p for p in files if "val" not in p.name],
              "val": [p for p in files if "val" in p.name]}
    out = {}
    for split, paths in splits.items():
        opened = [open_shard(p, vocab) for p in paths]
        for path, tokens in zip(paths, opened):
            check_ids(path, tokens, vocab, tokenizer)
        out[split] = ShardedTokens(opened)
    for split, tokens in out.items():
        if not len(tokens):
            raise UsageError(f"shard folder {str(folder)!r} has no {split} tokens (shards "
                             "whose name holds 'val' are validation, the others training)")
    return out
