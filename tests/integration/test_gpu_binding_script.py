"""A `gpu_request: gpus-per-task` script passes `sbatch --test-only` on the local cluster
(issue 12, item 2). The local nodes have no GPUs, so the profile is adapted for the test: the
generic GPU profile's script, with its GPU directives checked and then taken out, must be a job
the local Slurm accepts as it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm

GPU_DIRECTIVES = ("#SBATCH --gpus-per-task=1", "#SBATCH --gpu-bind=closest")


def test_a_gpus_per_task_script_passes_sbatch_test_only(slurm_cluster, tmp_path):
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--strategy", "ddp", "--nodes", "2",
         "--cluster", "generic-gpu", "--out", str(tmp_path / "runs"),
         "--set", "cluster.gpu_request=gpus-per-task", "--set", "cluster.gpu_bind=closest",
         "--set", "cluster.partition=debug", "--set", "cluster.extra_sbatch=[]",
         "--set", "cluster.mem=null", "--set", "cluster.cpus_per_task=1",
         "--set", "cluster.gpus_per_node=2"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    script = tmp_path / "runs" / "smoke" / "distributed-ps-2n" / "job.sbatch"
    assert rendered.stdout.split() == [str(script)]
    lines = script.read_text().splitlines()
    assert all(directive in lines for directive in GPU_DIRECTIVES), lines[:20]
    adapted = tmp_path / "adapted.sbatch"
    adapted.write_text("\n".join(line for line in lines if line not in GPU_DIRECTIVES) + "\n")
    test = subprocess.run(["sbatch", "--test-only", str(adapted)], capture_output=True,
                          text=True)
    assert test.returncode == 0, test.stderr
