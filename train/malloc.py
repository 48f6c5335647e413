"""The C allocator a training process runs with: tcmalloc rather than glibc's malloc on CPUs
(`train.malloc`).

On a CPU every activation, gradient and autocast copy is a host allocation, freed and made again
each step. glibc's malloc serves them slowly and, worse for a benchmark, at addresses that depend
on what the process allocated before: the same step measured 0.93x to 1.10x itself in different
processes, steady within each (docs/performance.md). tcmalloc made the tiny model's bf16 step
1.45x faster here and those differences vanished. `auto` takes tcmalloc only: jemalloc with its
default settings made the fp32 step 1.21x slower than glibc's (bench/speed_options.py); it is
there for sites that tune it (MALLOC_CONF) and name it.

`auto` leaves glibc's malloc in place where it is not worth a risk: on GPU hosts (the host
allocator hardly matters there), and in processes that initialise MPI (Horovod's MPI controller).
Open MPI interposes the memory functions (its memory patcher), and with tcmalloc preloaded one of
about 25 two-node Horovod-MPI runs here died of a segfault at start-up (a call through a null
pointer) that was not traced further. The same crash was later seen once under glibc's malloc
too (in CI, inside or before hvd.init), so tcmalloc is not its cause alone; the job script now
relaunches a launch whose rank died before every rank connected (HPCDP_START_RETRIES).

An allocator is chosen before a process starts (LD_PRELOAD), so `python -m train run`
re-executes itself once, before torch loads, with the library preloaded. Nothing here imports
torch.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path

from hpcdp.errors import UsageError

LIBRARIES = {
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4", "libtcmalloc.so",
                 "libtcmalloc_minimal.so"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
}
AUTO_ORDER = ("tcmalloc",)
CHOSEN = "HPCDP_MALLOC"
"""Set in the re-executed process (the allocator it was started with): never re-execute twice."""
INSTALL = ("install it (Debian/Ubuntu: apt-get install libtcmalloc-minimal4 or libjemalloc2; "
           "conda: gperftools or jemalloc)")


def library_dirs() -> list[Path]:
    """Where the libraries are looked for: LD_LIBRARY_PATH (environment modules), the Python
    environment's, then the system's."""
    loaded = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    prefixes = [os.environ.get("CONDA_PREFIX"), os.environ.get("VIRTUAL_ENV"), sys.prefix]
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    system = ["/usr/local/lib", "/usr/local/lib64", f"/usr/lib/{multiarch}", "/usr/lib64",
              "/usr/lib"]
    dirs = ([Path(d) for d in loaded] + [Path(p) / "lib" for p in prefixes if p]
            + [Path(d) for d in system])
    return list(dict.fromkeys(dirs))


def find(name: str, dirs: Iterable[Path] | None = None) -> Path | None:
    """The first library of allocator `name` in `dirs` (default: library_dirs())."""
    for folder in library_dirs() if dirs is None else dirs:
        for lib in LIBRARIES[name]:
            if (folder / lib).is_file():
                return folder / lib
    return None


def gpu_host(dev: Path = Path("/dev")) -> bool:
    """Whether this host has NVIDIA or AMD GPUs (their device files), without importing torch."""
    return any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()


def initialises_mpi(uses_horovod: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a Horovod process will run MPI: unless its controller is Gloo (horovodrun --gloo
    and the scripts say so in HOROVOD_CONTROLLER; Horovod takes MPI where it was built with it)."""
    environ = os.environ if environ is None else environ
    return uses_horovod and environ.get("HOROVOD_CONTROLLER", "mpi") != "gloo"


def choose(setting: str, dirs: Iterable[Path] | None = None, on_gpu_host: bool | None = None,
           uses_mpi: bool = False) -> tuple[str, Path | None]:
    """(allocator, library) for `train.malloc`: ("system", None) means glibc's malloc. A named
    allocator that is not installed is a UsageError; `auto` then falls back to the system's."""
    dirs = library_dirs() if dirs is None else list(dirs)
    if setting == "system":
        return "system", None
    if setting == "auto":
        if uses_mpi or (gpu_host() if on_gpu_host is None else on_gpu_host):
            return "system", None
        for name in AUTO_ORDER:
            if (lib := find(name, dirs)) is not None:
                return name, lib
        return "system", None
    lib = find(setting, dirs)
    if lib is None:
        raise UsageError(
            f"train.malloc {setting!r}: none of {', '.join(LIBRARIES[setting])} is in "
            f"{', '.join(map(str, dirs))}; {INSTALL}, or use train.malloc=auto or system")
    return setting, lib


def preload_env(setting: str, environ: Mapping[str, str] | None = None,
                dirs: Iterable[Path] | None = None, uses_mpi: bool = False) -> dict[str, str]:
    """The variables that start a process with `train.malloc`'s allocator preloaded: empty for
    the system's malloc, or when the allocator is already in LD_PRELOAD."""
    environ = os.environ if environ is None else environ
    name, lib = choose(setting, dirs, uses_mpi=uses_mpi)
    preloaded = environ.get("LD_PRELOAD", "")
    if lib is None or any(n in preloaded for n in LIBRARIES[name]):
        return {}
    return {"LD_PRELOAD": ":".join(filter(None, [str(lib), preloaded])), CHOSEN: name,
            # tcmalloc reports every allocation over 1 GiB on stderr (a big batch's logits).
            "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "1099511627776"}


def reexec_with(setting: str, uses_horovod: bool) -> None:
    """Replace this process by itself with `setting`'s allocator preloaded, unless that is
    already so (or this process is the re-executed one). Signal handlers reset on exec: call
    it before installing any."""
    if os.environ.get(CHOSEN):
        return
    extra = preload_env(setting, uses_mpi=initialises_mpi(uses_horovod))
    if not extra:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra})


def in_use(maps: Path = Path("/proc/self/maps")) -> str:
    """The allocator this process runs with, from the libraries it has mapped."""
    try:
        mapped = maps.read_text()
    except OSError:
        return "unknown"
    for name, libs in LIBRARIES.items():
        if any(f"/{lib.split('.so')[0]}.so" in mapped for lib in libs):
            return name
    return "system"
