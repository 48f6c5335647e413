#!/usr/bin/env bash
# The whole test suite: start the local Slurm cluster (the integration tests submit real jobs to
# it), ruff, then pytest over tests/unit and tests/integration. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! .venv/bin/hpcdp cluster up; then
    echo "test: the local Slurm cluster cannot start here; tests marked 'slurm' will be skipped"
fi
# Lint first: seconds, and it names the file and line.
.venv/bin/ruff check "$ROOT"
# Tests run ranks on the same two cores: one thread each keeps them from fighting.
export OMP_NUM_THREADS=1
# Two streams: the Slurm tests in order in one, the others beside it (tests/conftest.py says
# why). HPCDP_TEST_WORKERS=0 runs everything in this one process.
workers="${HPCDP_TEST_WORKERS:-2}"
case "$workers" in ''|*[!0-9]*) echo "test: HPCDP_TEST_WORKERS='$workers' is not a number" >&2; exit 2 ;; esac
if [ "$workers" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -n "$workers" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest -q "$@"
