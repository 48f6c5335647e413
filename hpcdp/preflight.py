"""Checks made before anything is submitted, so a job does not queue only to fail at start.

They run only where the job's Python is this one (profiles that leave `python` empty: the local
cluster, or a login node that shares its environment with the compute nodes).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from hpcdp.errors import UsageError

# Asked in a subprocess: importing horovod.torch imports torch, which the CLI never does.
_HOROVOD_PROBE = ("import horovod.torch as h; "
                  "print('mpi' if h.mpi_built() else '', 'gloo' if h.gloo_built() else '')")


def check_horovod(controller: str) -> None:
    """Horovod is importable here and was built with the controller the profile asks for."""
    if importlib.util.find_spec("horovod") is None:
        raise UsageError(f"strategy horovod needs Horovod, which is not installed in "
                         f"{sys.executable}: run scripts/install-horovod.sh (docs/horovod.md)")
    try:
        probe = subprocess.run([sys.executable, "-c", _HOROVOD_PROBE], capture_output=True,
                               text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise UsageError("importing horovod.torch took over 120 s; check the file system, "
                         "or rebuild with scripts/install-horovod.sh --rebuild") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"Horovod is installed but does not load ({last}): rebuild it with "
                         "scripts/install-horovod.sh --rebuild")
    built = probe.stdout.split()
    if controller not in built:
        raise UsageError(f"cluster.horovod_controller is {controller!r} but this Horovod was built "
                         f"with {', '.join(built) or 'no controller'}: rebuild with "
                         "scripts/install-horovod.sh --rebuild, or set "
                         f"cluster.horovod_controller to one of: {', '.join(built)}")
