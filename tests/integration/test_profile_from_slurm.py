"""`hpcdp profile` on the local cluster: the profile it sketches from Slurm for each kind of
partition (the gpu partition's nodes have 4 GPUs of gres, debug's none) loads, renders a
2-node DDP script, and that script's request is one Slurm would grant (`sbatch --test-only`
asks the scheduler and starts nothing). Bad input is one line, exit 2, and nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm


def hpcdp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ))


@pytest.mark.parametrize("partition,gpus", [("gpu", 4), ("debug", 0)])
def test_a_sketched_profile_asks_for_what_the_partition_can_grant(slurm_cluster, tmp_path,
                                                                  partition, gpus):
    from hpcdp import config

    path = tmp_path / f"{partition}.yaml"
    done = hpcdp("profile", "--partition", partition, "--out", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not done.stdout and f"wrote {path}" in done.stderr
    profile = config.load_profile(str(path))
    assert (profile.partition, profile.gpus_per_node) == (partition, gpus)
    assert "CHECK" in path.read_text()  # what Slurm cannot tell is marked
    scripts = tmp_path / "scripts"
    done = hpcdp("render", "--cluster", str(path), "--strategy", "ddp", "--nodes", "2",
                 "--scripts-dir", str(scripts), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (script,) = scripts.glob("*.sbatch")
    asked = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True,
                           text=True, timeout=60)
    assert asked.returncode == 0, asked.stderr
    assert f"in partition {partition}" in asked.stderr, asked.stderr
    # ...where one GPU more per node than the nodes have is refused by the same check
    if gpus:
        greedy = script.with_name("greedy.sbatch")
        greedy.write_text(script.read_text().replace(f"--gpus-per-node={gpus}",
                                                     f"--gpus-per-node={gpus + 1}"))
        assert subprocess.run(["sbatch", "--test-only", str(greedy)], capture_output=True,
                              timeout=60).returncode != 0


def test_bad_input_is_one_line_and_nothing_written(slurm_cluster, tmp_path):
    taken = tmp_path / "taken.yaml"
    taken.write_text("name: mine\n")
    cases = [
        (["--partition", "nope"], "no partition 'nope' on this cluster; partitions: debug, gpu"),
        (["--name", "a b"], "--name 'a b' is not allowed"),
        (["--out", str(taken)], "exists; give another file, or --force"),
        (["--out", str(tmp_path / "no" / "x.yaml")], "does not exist"),
    ]
    for args, says in cases:
        done = hpcdp("profile", *args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and says in done.stderr, (args, done.stderr)
        assert not done.stdout
    assert taken.read_text() == "name: mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.yaml"]
