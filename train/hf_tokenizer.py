"""The run's tokenizer as transformers loads it (AutoTokenizer.from_pretrained), for each of
hpcdp's kinds, encoding every text to the ids training used:

- bytes: a byte-level BPE with no merges whose id for each byte is the byte's value (the
  ByteLevel pre-tokenizer maps bytes to printable characters; the vocabulary maps them back);
  no special tokens (documents are separated by a blank line in training);
- bpe: the tokenizer.json `prepare` trained (the `tokenizers` library's own file);
- gpt2: GPT-2's BPE, from gpt2.tiktoken (ranks turned into vocabulary and merges, as
  tiktoken's own educational converter does) or from vocab.json + merges.txt.
"""

from __future__ import annotations

from pathlib import Path

from hpcdp.config import Experiment
from hpcdp.errors import UsageError
from train import tokenizer as ours

ENDOFTEXT = ours.ENDOFTEXT


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte to printable-character table (the ByteLevel pre-tokenizer's)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _byte_level(vocab: dict[str, int], merges: list[tuple[str, str]], use_regex: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    return tok


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token: run BPE on its bytes with only the ranks
    below its own, which leaves exactly two parts."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = min(((ranks.get(a + b, rank), i) for i, (a, b) in
                        enumerate(zip(parts[:-1], parts[1:]))), default=(rank, -1))
            if best[0] >= rank:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def build(exp: Experiment) -> tuple[object, dict[str, str], str]:
    """(tokenizers.Tokenizer, special tokens for transformers, what it is in words)."""
    from tokenizers import AddedToken, Tokenizer

    kind = exp.data.tokenizer
    if kind == "bytes":
        table = bytes_to_unicode()
        tok = _byte_level({table[b]: b for b in range(256)}, [], use_regex=False)
        return tok, {}, ("UTF-8 bytes: id = byte value (256 ids), no special tokens; documents "
                         "were separated by a blank line")
    if kind == "bpe":
        from train.data import prepared_path

        path = prepared_path(exp) / ours.BPE_FILE
        if not path.is_file():
            raise UsageError(f"the run's BPE tokenizer {path} is gone; prepare the data again "
                             "with the run's experiment to export its tokenizer")
        tok = Tokenizer.from_file(str(path))
        return tok, {"eos_token": ENDOFTEXT, "bos_token": ENDOFTEXT}, (
            f"a byte-level BPE trained on the corpus ({tok.get_vocab_size()} ids), "
            f"{ENDOFTEXT} ending each document")
    files = Path(exp.data.gpt2_files or "").expanduser()
    if files.is_file():
        ranks = ours.read_tiktoken_ranks(files)
        table = bytes_to_unicode()

        def text(token: bytes) -> str:
            return "".join(table[b] for b in token)

        vocab = {text(t): r for t, r in ranks.items()}
        merges = [(text(a), text(b)) for a, b in _merges_from_ranks(ranks)]
        tok = _byte_level(vocab, merges, use_regex=True)
    elif (files / "vocab.json").is_file() and (files / "merges.txt").is_file():
        from tokenizers import models

        tok = _byte_level({}, [], use_regex=True)
        tok.model = models.BPE.from_file(str(files / "vocab.json"), str(files / "merges.txt"))
    else:
        raise UsageError(f"data.gpt2_files {str(files)!r}: no gpt2.tiktoken file nor vocab.json "
                         f"+ merges.txt there to export GPT-2's tokenizer from")
    tok.add_special_tokens([AddedToken(ENDOFTEXT, special=True)])
    return tok, {"eos_token": ENDOFTEXT, "bos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}, (
        f"GPT-2's BPE (50,257 ids), {ENDOFTEXT} = 50256 ending each document")


def save(exp: Experiment, folder: Path) -> str:
    """Write the tokenizer into `folder` (tokenizer.json, tokenizer_config.json, ...); returns
    its description for the model card."""
    from transformers import PreTrainedTokenizerFast

    tok, special, said = build(exp)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=exp.train.seq_len,
                                   **special)
    fast.save_pretrained(str(folder))
    return said
