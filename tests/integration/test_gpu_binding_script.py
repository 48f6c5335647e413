"""The generic GPU profile's scripts pass `sbatch --test-only` on the local cluster with their
GPU lines as they are (issue 12, item 2; issue 19, item 13): its partition `gpu` has nodes with
4 GPUs each as Slurm sees them (device files, no driver: see test_gpu_nodes.py, which runs such
scripts to the end)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Only the gpu partition's nodes: scripts/test.sh runs these beside the debug partition's tests.
pytestmark = [pytest.mark.slurm, pytest.mark.gpu_partition]


@pytest.mark.parametrize("request_, directives", [
    ("gpus-per-task", ["#SBATCH --gpus-per-task=1", "#SBATCH --gpu-bind=closest"]),
    ("gres", ["#SBATCH --gres=gpu:4"]),
    ("gpus-per-node", ["#SBATCH --gpus-per-node=4"]),
])
def test_a_gpu_profile_script_passes_sbatch_test_only(slurm_cluster, tmp_path, request_,
                                                      directives):
    gres = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%G %t"], capture_output=True,
                          text=True).stdout
    if "gpu:4" not in gres or not any(s in gres for s in ("idle", "mix", "alloc")):
        pytest.skip("the local cluster has no GPU nodes (mknod not permitted where it started)")
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--strategy", "ddp", "--nodes", "2",
         "--cluster", "generic-gpu", "--out", str(tmp_path / "runs"),
         "--set", f"cluster.gpu_request={request_}", "--set", "cluster.gpu_bind=closest",
         "--set", "cluster.cpus_per_task=1"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    script = tmp_path / "runs" / "smoke" / "distributed-ps-2n" / "job.sbatch"
    assert rendered.stdout.split() == [str(script)]
    lines = script.read_text().splitlines()
    assert all(directive in lines for directive in directives), lines[:20]
    assert "#SBATCH --partition=gpu" in lines
    test = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True)
    assert test.returncode == 0, test.stderr
    # A request the nodes cannot meet is refused by the same check: it is not a rubber stamp.
    too_many = script.with_name("too-many.sbatch")
    too_many.write_text(script.read_text().replace(directives[0], directives[0][:-1] + "9"))
    refused = subprocess.run(["sbatch", "--test-only", str(too_many)], capture_output=True,
                             text=True)
    assert refused.returncode != 0, refused.stderr
