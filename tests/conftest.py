"""Fixtures shared by all tests: the local Slurm cluster, and a path that breaks bad quoting."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every shell metacharacter a run directory could smuggle into a script, as submitit's tests
# do. No newline: Slurm's --chdir cannot take one.
WEIRD_NAME = "we ird'dir\"$(touch PWNED)`touch TICK`;echo hi"


@pytest.fixture(scope="session", autouse=True)
def private_job_records(tmp_path_factory) -> Iterator[None]:
    """Jobs the tests submit are recorded in a private folder, not in the user's
    ~/.local/state/hpcdp (what `hpcdp status` shows them)."""
    os.environ["HPCDP_STATE_DIR"] = str(tmp_path_factory.mktemp("hpcdp-state"))
    yield


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The local Slurm cluster (started when it is not up); yields its directory.

    SLURM_CONF is exported for the whole session so that sbatch/srun/sacct find it. The cluster
    is left running at the end on purpose: the next test run (and other developers' runs)
    reuse it, which takes 0.1 s instead of a cold start. Stop it with `hpcdp cluster down`.
    """
    from hpcdp import cluster

    result = cluster.run_script("up")
    if result.returncode == cluster.CANNOT_START:
        pytest.skip(f"local Slurm cluster cannot start here: {result.last_line}")
    if result.returncode != 0:
        pytest.fail(f"`{cluster.SCRIPT} up` failed ({result.returncode}): {result.last_line}")
    os.environ.update(cluster.slurm_env())
    yield cluster.cluster_dir()


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A fresh directory whose name holds a space, quotes, $(...), a backtick, ';' and echo."""
    path = tmp_path / WEIRD_NAME
    path.mkdir()
    return path
