"""Horovod strategies are refused before anything is written or submitted when Horovod cannot
run them. A Horovod built without MPI cannot be had here without a second multi-minute build, so
a stand-in package on PYTHONPATH plays that part (and a broken one plays a failed build)."""

import os
import subprocess
import sys
from pathlib import Path


def fake_horovod(root: Path, body: str) -> Path:
    pkg = root / "fake" / "horovod"
    (pkg / "torch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "torch" / "__init__.py").write_text(body)
    return root / "fake"


def submit(tmp_path: Path, pythonpath: Path, *extra: str):
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, "-m", "hpcdp", "submit", "--strategy", "horovod",
                           "--nodes", "2", "--out", str(tmp_path / "runs"), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_horovod_built_without_the_profiles_controller(tmp_path):
    path = fake_horovod(tmp_path, "def mpi_built(): return False\ndef gloo_built(): return True\n")
    result = submit(tmp_path, path, "--set", "cluster.horovod_controller=mpi")
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "'mpi'" in line and "gloo" in line and "install-horovod.sh" in line
    assert len(line.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_horovod_that_does_not_load(tmp_path):
    path = fake_horovod(tmp_path, "raise ImportError('libmpi.so.40: cannot open shared object')\n")
    result = submit(tmp_path, path)
    assert result.returncode == 2
    assert "does not load" in result.stderr and "libmpi.so.40" in result.stderr
    assert "--rebuild" in result.stderr
    assert not (tmp_path / "runs").exists()
