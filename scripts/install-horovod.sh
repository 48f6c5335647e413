#!/usr/bin/env bash
# Build Horovod 0.28.1 against the torch already in a venv, cache the wheel, install it, verify it.
#
# Usage: scripts/install-horovod.sh [--venv DIR] [--gpu] [--force] [--rebuild] [--build-only]
#                                   [--print-cache-dir]
#
# Why a script and not a pip extra: Horovod's sdist has no pyproject.toml, so it must be built with
# --no-build-isolation against the torch that is already installed, and 0.28.1 needs a C++17 fix
# for torch >= 2.1 (see scripts/horovod-cxx17/ and docs/horovod.md). The build takes 2-4 minutes on
# 2 cores; the wheel is cached per (Horovod, torch, Python, cpu/gpu) so later installs take seconds.
#
# Exit codes: 0 ok, 1 build or verification failed, 2 bad usage, 3 a prerequisite is missing and
# this script cannot install it (not root, or not something it installs).
set -euo pipefail

readonly HOROVOD_VERSION=0.28.1
readonly SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
readonly TOOLCHAIN_FILE="$SCRIPT_DIR/horovod-cxx17/toolchain.cmake"

usage() {
    cat <<EOF
Usage: scripts/install-horovod.sh [--venv DIR] [--gpu] [--force] [--rebuild] [--build-only]
                                  [--print-cache-dir]

Builds Horovod $HOROVOD_VERSION (PyTorch + MPI + Gloo) against the torch in DIR, caches the wheel
under \${HPCDP_WHEEL_CACHE:-\$HOME/.cache/hpcdp/wheels}, installs it and checks what it was built with (as horovodrun --check-build).

  --venv DIR          virtual environment to install into (default: $REPO_ROOT/.venv)
  --gpu               also build NCCL tensor operations (HOROVOD_GPU_OPERATIONS=NCCL); needs a
                      CUDA build of torch, nvcc and NCCL (set HOROVOD_NCCL_HOME if not found)
  --force             reinstall even if Horovod $HOROVOD_VERSION is already importable (uses the
                      cached wheel when there is one)
  --rebuild           ignore the cached wheel and build again (implies --force)
  --build-only        build (or find) the cached wheel, install nothing: scripts/setup.sh
                      builds while pip installs the rest into the venv, then installs
  --print-cache-dir   print the wheel cache folder for this venv and exit
EOF
}

die() {  # die CODE MESSAGE...
    local code=$1
    shift
    echo "install-horovod: error: $*" >&2
    exit "$code"
}
say() { echo "install-horovod: $*"; }

venv="$REPO_ROOT/.venv"
gpu=0
force=0
rebuild=0
print_cache_dir=0
build_only=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --venv)
            [[ $# -ge 2 && -n "$2" ]] || die 2 "--venv needs a directory, e.g. --venv $REPO_ROOT/.venv"
            venv=$2
            shift 2
            ;;
        --venv=*) venv=${1#--venv=}; shift ;;
        --gpu) gpu=1; shift ;;
        --force) force=1; shift ;;
        --rebuild) rebuild=1; force=1; shift ;;
        --build-only) build_only=1; shift ;;
        --print-cache-dir) print_cache_dir=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die 2 "unknown option '$1' (valid: --venv DIR, --gpu, --force, --rebuild, --build-only, --print-cache-dir)" ;;
    esac
done

start_s=$(date +%s)
py="$venv/bin/python"
[[ -x "$py" ]] || die 2 "--venv '$venv' has no bin/python; give the folder of an existing virtual environment (e.g. $REPO_ROOT/.venv)"
venv=$(cd "$venv" && pwd)
# horovodrun and a pip-installed cmake live in the venv: put it first, as `activate` would.
export PATH="$venv/bin:$PATH"

# ---- torch and Python versions: they key the cache, since the wheel links against libtorch ----
versions=$("$py" - <<'EOF'
import sys
try:
    import torch
except ImportError:
    print("NO_TORCH")
    raise SystemExit
print(torch.__version__, "%d.%d" % sys.version_info[:2], torch.version.cuda or "none")
EOF
) || die 3 "cannot import torch in $venv (error above); fix the torch install first"
[[ "$versions" != NO_TORCH ]] || die 3 "torch is not installed in $venv; install the torch you want first (Horovod is compiled against it), e.g. '$py -m pip install torch==2.13.0'"
read -r torch_version python_version torch_cuda <<<"$versions"

cache_root=${HPCDP_WHEEL_CACHE:-$HOME/.cache/hpcdp/wheels}
cache_key="horovod-$HOROVOD_VERSION-torch$torch_version-py$python_version"
((gpu)) && cache_key+="-gpu"
cache_dir="$cache_root/$cache_key"
if ((print_cache_dir)); then
    echo "$cache_dir"
    exit 0
fi

# ---- what a Horovod must have been built with, and what the venv's has ----
wanted_marks=("PyTorch" "MPI" "Gloo")
((gpu)) && wanted_marks+=("NCCL")
# What `horovodrun --check-build` reports, asked in one process: check-build starts a process
# that imports torch for every line of its table (9 s here; this takes 2.5 s).
build_marks() {
    "$py" - 2>&1 <<'EOF'
import horovod
import horovod.torch as hvd

print(f"Horovod v{horovod.__version__}, as horovodrun --check-build reports it:")
for name, built in [("PyTorch", True), ("MPI", hvd.mpi_built()), ("Gloo", hvd.gloo_built()),
                    ("NCCL", hvd.nccl_built())]:
    print(f"    [{'X' if built else ' '}] {name}")
EOF
}
missing_marks() {  # missing_marks BUILD_MARKS_OUTPUT: the wanted marks not ticked [X]
    local mark
    for mark in "${wanted_marks[@]}"; do
        grep -Eq "^\s*\[X\] $mark\s*$" <<<"$1" || echo "$mark"
    done
}

# ---- already installed? ----
# Exit status 0: the right version is importable (with NCCL ops when --gpu asked for them).
installed_check() {
    local marks
    marks=$(build_marks) && grep -q "^Horovod v$HOROVOD_VERSION," <<<"$marks" &&
        [[ -z "$(missing_marks "$marks")" ]]
}
if ((!force)) && installed_check; then
    say "Horovod $HOROVOD_VERSION is already installed in $venv; nothing to do (--force reinstalls)."
    say "done in $(($(date +%s) - start_s)) s"
    exit 0
fi

# ---- system prerequisites: Open MPI (the wheel links libmpi.so.40), cmake >= 3.21, g++ ----
apt_install() {  # apt_install WHAT-FOR PACKAGE...
    local what=$1
    shift
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        die 3 "$what is missing. Install it (Debian/Ubuntu: 'sudo apt-get install $*'; on a cluster: 'module load' it) and run this again."
    fi
    say "installing $* with apt-get ($what is missing)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; } ||
        die 3 "apt-get install $* failed"
}
command -v mpicc >/dev/null || apt_install "Open MPI (mpicc)" openmpi-bin libopenmpi-dev
command -v g++ >/dev/null || apt_install "a C++ compiler (g++)" g++
cmake_bin=${HOROVOD_CMAKE:-cmake}
command -v "$cmake_bin" >/dev/null || apt_install "CMake" cmake
cmake_version=$("$cmake_bin" --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
# The C++17 fix passes its toolchain file through the CMAKE_TOOLCHAIN_FILE environment variable,
# which CMake reads only from 3.21 on.
if [[ "$(printf '%s\n' 3.21 "$cmake_version" | sort -V | head -1)" != 3.21 ]]; then
    die 3 "CMake $cmake_version is too old (need >= 3.21 for CMAKE_TOOLCHAIN_FILE). Run '$py -m pip install \"cmake>=3.21\"' (it lands in $venv/bin, which this script puts first on PATH) or 'module load cmake', then run this again."
fi
if ((gpu)); then
    [[ "$torch_cuda" != none ]] || die 3 "--gpu needs a CUDA build of torch, but $venv has torch $torch_version (CPU only)."
    command -v nvcc >/dev/null || [[ -n "${CUDA_HOME:-}" ]] ||
        die 3 "--gpu needs the CUDA toolkit (nvcc not on PATH, CUDA_HOME unset): e.g. 'module load cuda/$torch_cuda'."
fi

# ---- build-time Python packages: Horovod builds against these, outside build isolation ----
if ! "$py" -c 'import setuptools, wheel' 2>/dev/null; then
    say "installing setuptools and wheel into $venv"
    "$py" -m pip install -q setuptools wheel || die 1 "pip install setuptools wheel failed"
fi

mkdir -p "$cache_dir"
# Two installs at once (two shells, two tests) must not build twice or see a half-written wheel.
exec 9>"$cache_dir/.lock"
flock 9

find_wheel() { compgen -G "$cache_dir/horovod-$HOROVOD_VERSION-*.whl" | head -1 || true; }

wheel=$(find_wheel)
action=""
if [[ -n "$wheel" ]] && ((!rebuild)); then
    action="reused cached wheel"
    say "reusing cached wheel $wheel (no build)"
else
    build_log="$cache_dir/build.log"
    staging=$(mktemp -d "$cache_dir/.staging.XXXXXX")
    trap 'rm -rf "$staging"' EXIT
    ops="CPU (MPI + Gloo)"
    gpu_env=()
    if ((gpu)); then
        ops="MPI + Gloo + NCCL"
        gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL)
    fi
    say "building Horovod $HOROVOD_VERSION for torch $torch_version, Python $python_version, ops: $ops"
    say "this takes 2-4 minutes on 2 cores; log: $build_log"
    build_start_s=$(date +%s)
    # CMAKE_TOOLCHAIN_FILE is set for this one command only: anything else CMake builds must not
    # inherit the C++17 override.
    if ! env CMAKE_TOOLCHAIN_FILE="$TOOLCHAIN_FILE" \
        MAKEFLAGS="${MAKEFLAGS:--j2}" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "${gpu_env[@]}" \
        "$py" -m pip wheel -v --no-build-isolation --no-deps --no-cache-dir \
        "horovod==$HOROVOD_VERSION" -w "$staging" >"$build_log" 2>&1; then
        tail -n 40 "$build_log" >&2
        die 1 "building Horovod failed after $(($(date +%s) - build_start_s)) s; full log: $build_log (last 40 lines above)"
    fi
    built=$(compgen -G "$staging/horovod-$HOROVOD_VERSION-*.whl" | head -1 || true)
    [[ -n "$built" ]] || die 1 "pip wheel succeeded but left no horovod wheel in $staging; log: $build_log"
    rm -f "$cache_dir"/horovod-"$HOROVOD_VERSION"-*.whl
    mv "$built" "$cache_dir/"  # same file system: the wheel appears whole or not at all
    wheel="$cache_dir/$(basename "$built")"
    action="built wheel in $(($(date +%s) - build_start_s)) s"
    say "built $wheel ($action)"
fi
if ((build_only)); then
    say "wheel ready: $wheel ($action); --build-only: nothing installed"
    exit 0
fi

# ---- install: the wheel without resolving deps (pip must not touch torch), then its own deps ----
say "installing $wheel into $venv"
"$py" -m pip install -q --no-deps --force-reinstall "$wheel" || die 1 "pip install $wheel failed"
# Horovod's runtime deps (cloudpickle, psutil, pyyaml, packaging, cffi), read from the wheel's
# METADATA rather than hard-coded, skipping the optional extras (tensorflow, spark, ray, ...).
mapfile -t deps < <("$py" - "$wheel" <<'EOF'
import sys
import zipfile
from email.parser import Parser

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" not in requirement:
        print(requirement)
EOF
)
if ((${#deps[@]})); then
    "$py" -m pip install -q "${deps[@]}" || die 1 "installing Horovod's dependencies (${deps[*]}) failed"
fi

# ---- verify: the build must have the framework and both controllers we rely on ----
# horovodrun must be there too: the horovod strategies' scripts launch with it.
[[ -x "$venv/bin/horovodrun" ]] || die 1 "the wheel installed no $venv/bin/horovodrun"
check_output=$(build_marks) || {
    echo "$check_output" >&2
    die 1 "importing horovod.torch failed (output above)"
}
echo "$check_output"
mapfile -t missing < <(missing_marks "$check_output")
((${#missing[@]} == 0)) || die 1 "Horovod was installed without: ${missing[*]} (see [ ] marks above); rebuild with --rebuild and read $cache_dir/build.log"

say "installed Horovod $HOROVOD_VERSION into $venv ($action; torch $torch_version, Python $python_version; verified: ${wanted_marks[*]})"
say "done in $(($(date +%s) - start_s)) s"
