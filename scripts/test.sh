#!/usr/bin/env bash
# The whole test suite: start the local Slurm cluster (the integration tests submit real jobs to
# it), ruff, then pytest over tests/unit and tests/integration. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The default link rate, whatever rate an earlier `hpcdp cluster link --rate` left: the tests
# that depend on it assume it.
if ! .venv/bin/hpcdp cluster up --link default; then
    echo "test: the local Slurm cluster cannot start here; tests marked 'slurm' will be skipped"
fi
# Lint first: seconds, and it names the file and line.
.venv/bin/ruff check "$ROOT"
# Tests run ranks on the same two cores: one thread each keeps them from fighting.
export OMP_NUM_THREADS=1
# Three pytest processes at once: the tests that need the Slurm cluster, in order, and the
# others split in two (tests/conftest.py SECOND_LOCAL_STREAM).
# Why: a Slurm test leaves the CPUs idle while it waits for the scheduler, sacct and requeues,
# and the tests that start local processes fill that time; with one process of them, a core sat
# idle whenever it ran a one-process test beside a waiting Slurm test (docs/performance.md,
# "Test time"). The Slurm tests of the debug partition stay one at a time, so none
# depends on which nodes Slurm hands out; those of the gpu partition (its own nodes, marked
# gpu_partition) run in a local stream, beside them.
work=$(mktemp -d "${TMPDIR:-/tmp}/hpcdp-test.XXXXXX")
# torch.compile's kernels: a cache of this run's own, so that a run here costs what it costs on a
# fresh machine (CI), where the default cache (/tmp/torchinductor_$USER) starts empty.
export TORCHINDUCTOR_CACHE_DIR="$work/inductor"
# HPCDP_TEST_STREAMS=1 runs everything in one process.
if [ "${HPCDP_TEST_STREAMS:-3}" = 1 ]; then
    exec .venv/bin/python -m pytest -q "$@"
fi
# Each stream its own temporary folder (pytest prunes old numbered ones, maybe another's) and log.
local_stream() {  # NAME MARKERS ARGS...: a pytest process in the background, its output to a file
    local name=$1 markers=$2
    shift 2
    .venv/bin/python -m pytest -q -m "$markers" -p no:cacheprovider \
        --basetemp="$work/$name" "$@" >"$work/$name.txt" 2>&1 &
}
local_stream local "(not slurm or gpu_partition) and not second_local_stream" "$@"
local_pid=$!
local_stream local2 "(not slurm or gpu_partition) and second_local_stream" "$@"
local2_pid=$!
status=0
.venv/bin/python -m pytest -q -m "slurm and not gpu_partition" --basetemp="$work/slurm" "$@" ||
    status=$?
local_status=0
wait "$local_pid" || local_status=$?
local2_status=0
wait "$local2_pid" || local2_status=$?
echo "test: the tests without Slurm, and the gpu partition's (run beside the tests above):"
cat "$work/local.txt"
echo "test: the tests without Slurm of tests/conftest.py's SECOND_LOCAL_STREAM (run beside them):"
cat "$work/local2.txt"
echo "test: temporary files of this run: $work"
# pytest's 5: no test selected (a path with no Slurm tests, or none without): not a failure.
for s in "$status" "$local_status" "$local2_status"; do
    if [ "$s" != 0 ] && [ "$s" != 5 ]; then exit "$s"; fi
done
[ "$status" = 5 ] && [ "$local_status" = 5 ] && [ "$local2_status" = 5 ] && exit 5
exit 0
