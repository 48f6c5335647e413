"""Whether Horovod's PyTorch binding loads in this venv, asked once per pytest process.

The probe is a fresh interpreter (`import horovod.torch` imports torch: about 2 CPU-seconds),
so the pytest process itself stays free of torch; each test module used to ask again."""

from __future__ import annotations

import functools
import subprocess
import sys

SKIP_REASON = "Horovod is not installed (scripts/install-horovod.sh)"


@functools.cache
def horovod_importable() -> bool:
    return subprocess.run([sys.executable, "-c", "import horovod.torch"],
                          capture_output=True).returncode == 0
