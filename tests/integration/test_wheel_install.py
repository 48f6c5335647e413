"""Issue 48, item 1: hpcdp installed from its wheel, as a user installs it on a login node, works
from any folder: the templates, profiles, experiments and the local cluster's script ship inside
the package (hpcdp/shipped/), and a job it submits trains with the installed train/.

The fresh environment is a venv outside the source tree with the wheel installed in it; its
dependencies (torch, transformers, ...) come from the project's .venv through a path line, as
the machine has no network to install them again. The editable install of the source tree is
not seen there (a path line adds no .pth of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv holding hpcdp's wheel (built here, without network)."""
    tmp = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp / "dist"), str(PROJECT_ROOT)],
                           capture_output=True, text=True, timeout=300, cwd=tmp)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("hpcdp-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp / "fresh")],
                   check=True, timeout=120)
    python = tmp / "fresh" / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (site / "hpcdp-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def run(python: Path, *args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_installed_wheel_renders_submits_harvests_and_exports_from_any_folder(
        installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run(installed, "-c", "import hpcdp, train; print(hpcdp.__file__); "
                "print(hpcdp.TEMPLATES_DIR); print(train.__file__)", cwd=elsewhere)
    assert where.returncode == 0, where.stderr
    package, templates, trainer = where.stdout.split()
    assert not package.startswith(str(PROJECT_ROOT)), package  # the wheel's, not the checkout
    assert templates.endswith("hpcdp/shipped/templates") and not trainer.startswith(
        str(PROJECT_ROOT)), where.stdout
    rendered = run(installed, "-m", "hpcdp", "render", "--strategy", "ddp", "--nodes", "2",
                   "--out", str(tmp_path / "runs"), cwd=elsewhere)
    assert rendered.returncode == 0, rendered.stderr
    campaign = run(installed, "-m", "hpcdp", "compare", "--render", "--out",
                   str(tmp_path / "campaign"), cwd=elsewhere)
    assert campaign.returncode == 0, campaign.stderr
    status = run(installed, "-m", "hpcdp", "cluster", "status", cwd=elsewhere)
    assert status.returncode == 0 and "slurmctld" in status.stdout, status.stdout + status.stderr
    submitted = run(installed, "-m", "hpcdp", "submit", "--strategy", "single-gpu", "--nodes",
                    "1", "--out", str(tmp_path / "jobs"), "--set", "train.steps=3",
                    "--set", "train.eval_interval=0", "--set", "train.checkpoint_interval=3",
                    "--wait", "--timeout", "300", cwd=elsewhere, timeout=400)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    (run_dir,) = (tmp_path / "jobs").glob("*/single-gpu-1n")
    harvested = run(installed, "-m", "hpcdp", "harvest", str(run_dir), "--format", "json",
                    cwd=elsewhere)
    assert harvested.returncode == 0, harvested.stderr
    assert json.loads(harvested.stdout)["runs"][0]["steps"] == 3
    exported = run(installed, "-m", "hpcdp", "export", str(run_dir), "--to",
                   str(tmp_path / "hf"), cwd=elsewhere)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()
