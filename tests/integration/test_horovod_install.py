"""scripts/install-horovod.sh and the Horovod it installs: real build checks, real 2-process runs.

The tests marked `horovod` need Horovod importable in the venv that runs pytest (run
scripts/install-horovod.sh once; it takes 2-4 minutes on 2 cores) and skip with the reason
otherwise. The argument tests run everywhere.

test_second_install_reuses_cached_wheel reinstalls the cached wheel into a side venv that sees
this one's packages, not into this venv: the Slurm tests beside it (scripts/test.sh runs two
streams) import Horovod from here, and once met it half-replaced.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-horovod.sh"
HOROVOD_VERSION = "0.28.1"
VENV = Path(sys.prefix)
VENV_BIN = Path(sys.executable).parent
# Guards against a hung collective; not a speed assertion.
HANG_TIMEOUT_S = 300

# Each rank contributes rank+1; the average over 2 ranks is (1 + 2) / 2 = 1.5. It also reports
# which controller Horovod actually runs under, so "--gloo" cannot silently fall back to MPI.
ALLREDUCE_SCRIPT = """
import torch
import horovod.torch as hvd

hvd.init()
average = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Average, name="rank_plus_one")
controller = "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "none"
print(f"rank={hvd.rank()} size={hvd.size()} controller={controller} average={average.item()}",
      flush=True)
hvd.shutdown()
"""


def _horovod_import_error() -> str | None:
    """None when `import horovod.torch` works in this venv, else the error's last line."""
    probe = subprocess.run(
        [sys.executable, "-c", "import horovod, horovod.torch; print(horovod.__version__)"],
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT_S,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or ["(no error output)"]
        return lines[-1]
    if probe.stdout.strip() != HOROVOD_VERSION:
        return f"horovod {probe.stdout.strip()} is installed, these tests expect {HOROVOD_VERSION}"
    return None


@pytest.fixture(scope="module")
def horovod_installed() -> None:
    # A fixture, not a module-level skipif: the probe imports torch (seconds), which every
    # `pytest` collection would otherwise pay.
    error = _horovod_import_error()
    if error is not None:
        pytest.skip(
            f"Horovod is not importable in {VENV} ({error}); "
            "install it with scripts/install-horovod.sh"
        )


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    # Tests run as root here; Open MPI refuses that unless told (harmless for other users).
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, env=_env(), timeout=HANG_TIMEOUT_S, cwd=REPO_ROOT
    )


def _check_build_marks(output: str) -> set[str]:
    """Names ticked [X] in `horovodrun --check-build` output."""
    return set(re.findall(r"^\s*\[X\]\s+(\S+)\s*$", output, flags=re.MULTILINE))


def _assert_two_ranks_averaged(result: subprocess.CompletedProcess[str], controller: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    ranks = re.findall(
        r"rank=(\d) size=(\d) controller=(\w+) average=([0-9.]+)", result.stdout
    )
    assert sorted(rank for rank, *_ in ranks) == ["0", "1"], output
    for _rank, size, used_controller, average in ranks:
        assert size == "2", output
        assert used_controller == controller, output
        assert float(average) == pytest.approx(1.5), output


# ---- the script's arguments: no Horovod needed ----


def test_unknown_option_is_a_usage_error() -> None:
    result = _run([str(INSTALL_SCRIPT), "--venvv", str(VENV)])
    assert result.returncode == 2
    assert "unknown option '--venvv'" in result.stderr
    assert "--venv DIR" in result.stderr


def test_missing_venv_is_a_usage_error(tmp_path: Path) -> None:
    result = _run([str(INSTALL_SCRIPT), "--venv", str(tmp_path / "no-such-venv")])
    assert result.returncode == 2
    assert "no-such-venv" in result.stderr and "has no bin/python" in result.stderr


def test_venv_without_torch_exits_3_and_says_to_install_torch(tmp_path: Path) -> None:
    bare_venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare_venv)], check=True)
    result = _run([str(INSTALL_SCRIPT), "--venv", str(bare_venv)])
    assert result.returncode == 3, result.stdout + result.stderr
    assert "torch is not installed" in result.stderr


def test_gpu_build_refuses_a_cpu_only_torch() -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip(f"torch {torch.__version__} is a CUDA build; this checks the CPU-only refusal")
    result = _run([str(INSTALL_SCRIPT), "--venv", str(VENV), "--gpu"])
    assert result.returncode == 3, result.stdout + result.stderr
    assert "--gpu needs a CUDA build of torch" in result.stderr
    assert "building Horovod" not in result.stdout


def test_cache_dir_is_keyed_by_horovod_torch_python_and_gpu(tmp_path: Path) -> None:
    import torch

    env_cache = tmp_path / "wheel cache"  # a space: paths must be quoted in the script
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    expected = env_cache / f"horovod-{HOROVOD_VERSION}-torch{torch.__version__}-py{python}"
    for extra_args, suffix in (([], ""), (["--gpu"], "-gpu")):
        result = subprocess.run(
            [str(INSTALL_SCRIPT), "--venv", str(VENV), "--print-cache-dir", *extra_args],
            capture_output=True,
            text=True,
            env={**_env(), "HPCDP_WHEEL_CACHE": str(env_cache)},
            timeout=HANG_TIMEOUT_S,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{expected}{suffix}"


# ---- the installed Horovod ----


@pytest.mark.horovod
@pytest.mark.usefixtures("horovod_installed")
def test_check_build_lists_pytorch_mpi_and_gloo() -> None:
    result = _run([str(VENV_BIN / "horovodrun"), "--check-build"])
    assert result.returncode == 0, result.stderr
    assert {"PyTorch", "MPI", "Gloo"} <= _check_build_marks(result.stdout), result.stdout
    assert f"Horovod v{HOROVOD_VERSION}" in result.stdout


@pytest.mark.horovod
@pytest.mark.usefixtures("horovod_installed")
def test_allreduce_two_ranks_with_horovodrun_gloo(tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    result = _run(
        [str(VENV_BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable, str(script)]
    )
    _assert_two_ranks_averaged(result, controller="gloo")


@pytest.mark.horovod
@pytest.mark.usefixtures("horovod_installed")
def test_allreduce_two_ranks_with_mpirun(tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE_SCRIPT)
    result = _run(
        ["mpirun", "-np", "2", "--allow-run-as-root", "--oversubscribe",
         sys.executable, str(script)]
    )
    _assert_two_ranks_averaged(result, controller="mpi")


@pytest.mark.horovod
@pytest.mark.usefixtures("horovod_installed")
def test_second_install_reuses_cached_wheel(tmp_path: Path) -> None:
    cache_dir = Path(_run([str(INSTALL_SCRIPT), "--venv", str(VENV), "--print-cache-dir"])
                     .stdout.strip())
    wheels = sorted(cache_dir.glob(f"horovod-{HOROVOD_VERSION}-*.whl"))
    if not wheels:
        pytest.skip(
            f"no cached wheel in {cache_dir}: Horovod was installed some other way; "
            "run scripts/install-horovod.sh once to fill the cache (a build takes 2-4 minutes)"
        )

    # Installed and no --force: it must do nothing at all.
    untouched = _run([str(INSTALL_SCRIPT), "--venv", str(VENV)])
    assert untouched.returncode == 0, untouched.stdout + untouched.stderr
    assert "already installed" in untouched.stdout
    assert "installing" not in untouched.stdout

    # --force: reinstall, from the cache, without building, then verify; in a side venv whose
    # own site-packages come first and whose .pth adds this venv's (pip leaves packages
    # outside its environment alone, so this venv's Horovod is never touched).
    side = tmp_path / "side-venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(side)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = subprocess.run([str(side / "bin" / "python"), "-c", purelib],
                                   capture_output=True, text=True, check=True).stdout.strip()
    shared = next(p for p in sys.path if p.startswith(sys.prefix) and p.endswith("site-packages"))
    Path(site_packages, "shared-venv.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    # --build-only (scripts/setup.sh builds while pip installs the rest): the cached wheel is
    # ready, and nothing lands in the venv.
    build_only = _run([str(INSTALL_SCRIPT), "--venv", str(side), "--force", "--build-only"])
    output = build_only.stdout + build_only.stderr
    assert build_only.returncode == 0, output
    assert "--build-only: nothing installed" in output and "reused cached wheel" in output
    assert "installing" not in output
    assert not list(Path(site_packages).glob("horovod*")), output
    reinstall = _run([str(INSTALL_SCRIPT), "--venv", str(side), "--force"])
    output = reinstall.stdout + reinstall.stderr
    assert reinstall.returncode == 0, output
    assert "reused cached wheel" in output
    assert "building Horovod" not in output
    assert {"PyTorch", "MPI", "Gloo"} <= _check_build_marks(reinstall.stdout), output
    where = subprocess.run([str(side / "bin" / "python"), "-c",
                            "import horovod.torch, horovod; print(horovod.__file__)"],
                           capture_output=True, text=True)
    assert where.returncode == 0 and where.stdout.startswith(str(side)), where.stdout + where.stderr
    assert _horovod_import_error() is None  # this venv's, untouched
