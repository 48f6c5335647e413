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
exec .venv/bin/python -m pytest -q "$@"
