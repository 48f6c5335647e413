"""train.malloc: which allocator a training process is started with, found without torch."""

from __future__ import annotations

import pytest

from hpcdp.errors import UsageError
from train import malloc


def _libs(folder, *names):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"\x7fELF")
    return folder


def test_auto_takes_tcmalloc_or_else_the_system_allocator(tmp_path):
    both = _libs(tmp_path / "both", "libjemalloc.so.2", "libtcmalloc_minimal.so.4")
    only_je = _libs(tmp_path / "je", "libjemalloc.so.2")
    empty = _libs(tmp_path / "empty")
    assert malloc.choose("auto", [both], on_gpu_host=False) == (
        "tcmalloc", both / "libtcmalloc_minimal.so.4")
    # jemalloc's defaults measured slower than glibc's in fp32: only when named.
    assert malloc.choose("auto", [empty, only_je], on_gpu_host=False) == ("system", None)
    assert malloc.choose("jemalloc", [empty, only_je], on_gpu_host=False) == (
        "jemalloc", only_je / "libjemalloc.so.2")
    assert malloc.choose("auto", [empty], on_gpu_host=False) == ("system", None)


def test_auto_leaves_gpu_hosts_alone_but_a_named_allocator_applies(tmp_path):
    both = _libs(tmp_path / "both", "libjemalloc.so.2", "libtcmalloc.so.4")
    assert malloc.choose("auto", [both], on_gpu_host=True) == ("system", None)
    assert malloc.choose("jemalloc", [both], on_gpu_host=True) == (
        "jemalloc", both / "libjemalloc.so.2")
    assert malloc.choose("system", [both], on_gpu_host=False) == ("system", None)


def test_a_named_allocator_that_is_missing_says_where_it_looked_and_what_to_do(tmp_path):
    empty = _libs(tmp_path / "empty")
    with pytest.raises(UsageError) as err:
        malloc.choose("jemalloc", [empty], on_gpu_host=False)
    message = str(err.value)
    assert "train.malloc 'jemalloc'" in message and str(empty) in message
    assert "libjemalloc2" in message and "train.malloc=auto or system" in message


def test_gpu_hosts_are_told_by_their_device_files(tmp_path):
    (tmp_path / "nvidiactl").touch()  # the driver alone, no GPU
    assert not malloc.gpu_host(tmp_path)
    (tmp_path / "nvidia0").touch()
    assert malloc.gpu_host(tmp_path)
    amd = tmp_path / "amd"
    amd.mkdir()
    (amd / "kfd").touch()
    assert malloc.gpu_host(amd)


def test_preload_env_puts_the_library_first_and_is_empty_when_already_preloaded(tmp_path):
    lib = _libs(tmp_path / "lib", "libjemalloc.so.2") / "libjemalloc.so.2"
    extra = malloc.preload_env("jemalloc", {"LD_PRELOAD": "/opt/site/libhook.so"},
                               [tmp_path / "lib"])
    assert extra["LD_PRELOAD"] == f"{lib}:/opt/site/libhook.so"
    assert extra[malloc.CHOSEN] == "jemalloc"
    assert malloc.preload_env("jemalloc", {}, [tmp_path / "lib"])["LD_PRELOAD"] == str(lib)
    assert malloc.preload_env("jemalloc", {"LD_PRELOAD": str(lib)}, [tmp_path / "lib"]) == {}
    assert malloc.preload_env("system", {}, [tmp_path / "lib"]) == {}


def test_in_use_reads_the_mapped_libraries(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert malloc.in_use(maps) == "system"
    maps.write_text(maps.read_text() + "7f02-7f03 r-xp 0 08:01 2 "
                    "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
    assert malloc.in_use(maps) == "tcmalloc"
    assert malloc.in_use(tmp_path / "missing") == "unknown"


def test_library_dirs_start_with_ld_library_path_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path / 'module'}::{tmp_path / 'other'}")
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path / "conda"))
    dirs = malloc.library_dirs()
    assert dirs[:3] == [tmp_path / "module", tmp_path / "other", tmp_path / "conda" / "lib"]
    assert len(dirs) == len(set(dirs))


def test_auto_keeps_the_system_allocator_where_horovod_runs_mpi(tmp_path):
    both = _libs(tmp_path / "both", "libtcmalloc.so.4")
    assert malloc.initialises_mpi(True, {})  # Horovod takes MPI where it was built with it
    assert malloc.initialises_mpi(True, {"HOROVOD_CONTROLLER": "mpi"})
    assert not malloc.initialises_mpi(True, {"HOROVOD_CONTROLLER": "gloo"})
    assert not malloc.initialises_mpi(False, {})
    assert malloc.choose("auto", [both], on_gpu_host=False, uses_mpi=True) == ("system", None)
    assert malloc.choose("tcmalloc", [both], on_gpu_host=False, uses_mpi=True) == (
        "tcmalloc", both / "libtcmalloc.so.4")
