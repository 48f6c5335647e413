#!/usr/bin/env bash
# The demo: start the local Slurm cluster, run the smoke experiment (every strategy that fits,
# on 1 and 2 nodes, twice each) as one `hpcdp compare` campaign, whose cells run one after
# another in one allocation (cells submitted as separate jobs would all run at once on this
# machine's cores and measure their contention), then show the comparison with its intervals.
# Where the local cluster cannot start, the same training runs as local processes, and it says so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HPCDP=.venv/bin/hpcdp
export OMP_NUM_THREADS=1

sets=()
if ! .venv/bin/python -c "import horovod.torch" 2>/dev/null; then
    echo "demo: Horovod is not installed (scripts/install-horovod.sh); leaving horovod out"
    sets=(--set "matrix.strategies=[$("$HPCDP" strategies --names --paper --without-horovod)]")
fi

if "$HPCDP" cluster up; then
    echo "demo: each node has a core and a network link of its own (hpcdp cluster status): the"
    echo "demo: 2-node cells pay for their gradients crossing the link (docs/local-cluster.md)"
    # --fresh: a second demo measures anew (the earlier one moves to runs/smoke/compare.old-*)
    "$HPCDP" compare --experiment smoke --repeats 2 "${sets[@]}" --fresh --wait
    results=runs/smoke/compare
else
    echo "demo: the local Slurm cluster cannot start here (see the reason above);"
    echo "demo: running the same training as local processes on this machine instead (1 node)"
    "$HPCDP" run --experiment smoke --ranks 2 "${sets[@]}"
    results=runs/smoke
fi
echo
"$HPCDP" harvest "$results" --out runs/smoke/harvest
echo "demo: tables and plots in runs/smoke/harvest/"
