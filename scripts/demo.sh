#!/usr/bin/env bash
# The demo: start the local Slurm cluster, submit the smoke experiment (every strategy that fits,
# on 1 and 2 nodes) with `hpcdp submit`, follow the jobs, then show the comparison table.
# Where the local cluster cannot start, the same jobs run as local processes, and it says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HPCDP=.venv/bin/hpcdp
export OMP_NUM_THREADS=1

sets=()
if ! .venv/bin/python -c "import horovod.torch" 2>/dev/null; then
    echo "demo: Horovod is not installed (scripts/install-horovod.sh); leaving horovod out"
    sets=(--set "matrix.strategies=[$("$HPCDP" strategies --names --without-horovod)]")
fi

if "$HPCDP" cluster up; then
    "$HPCDP" submit --experiment smoke "${sets[@]}" --wait
else
    echo "demo: the local Slurm cluster cannot start here (see the reason above);"
    echo "demo: running the same training as local processes on this machine instead (1 node)"
    "$HPCDP" run --experiment smoke --ranks 2 "${sets[@]}"
fi
echo
"$HPCDP" harvest runs/smoke --out runs/smoke/harvest
echo "demo: tables and plots in runs/smoke/harvest/"
