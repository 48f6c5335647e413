"""Importing torch and transformers with Python's cyclic garbage collector paused.

The import creates hundreds of thousands of objects, none of them garbage, and the collector
walks them about 870 times meanwhile: 0.7 s of a rank's 4.2 s start on these CPUs
(bench/import_gc.py). Every rank of every launch, requeue and resumed leg pays it, so the
heavy imports run with the collector off; what they loaded is then frozen (gc.freeze), so the
training loop's own collections skip those long-lived objects too.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def without_gc() -> Iterator[None]:
    """Run the block (imports) with the collector off, then freeze what is alive and turn it
    back on, also when the import fails (a missing package must not leave it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
