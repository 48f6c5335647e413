"""The GPU profile's scripts, run by hand with plain `sbatch` on GPU nodes of a real Slurm
(issue 19, item 13).

The local cluster's partition `gpu` has two nodes with 4 GPUs each as Slurm sees them: gres on
character devices made with mknod, no driver behind them (scripts/local-slurm.sh). Slurm
allocates them, binds them and sets CUDA_VISIBLE_DEVICES per task exactly as on a GPU cluster;
torch then finds no GPU and trains on the CPU. So what these tests check is everything up to the
device: the #SBATCH GPU lines, srun's layout per launcher and strategy, the GPUs each rank is
given and the one it would drive (`hpcdp env`'s rule, recorded by every rank in
RUN_DIR/ranks/rank-R.json), and that the job COMPLETES. What a real GPU adds (CUDA, NCCL) is
bench/gpu_check.sh's part.

Every job is submitted first and waited for together: the two GPU nodes run them one after
another while the test reads the first."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from horovod_probe import horovod_importable
from slurm_jobs import logs, records, sets, wait_all

from hpcdp import cluster

# Only the gpu partition's nodes: scripts/test.sh runs these beside the debug partition's tests.
pytestmark = [pytest.mark.slurm, pytest.mark.gpu_partition]

GPUS_PER_NODE = 2  # of the 4 a GPU node has: two ranks per node keep the jobs short

# The generic GPU profile as a site would adapt it to this cluster: its partition is `gpu`
# already; no modules, no venv to source, the nodes' interface for NCCL and Gloo, one CPU per
# task.
ADAPTED = sets("cluster.modules=[]", "cluster.setup=[]", f"cluster.python={sys.executable}",
               f"cluster.network_interface={cluster.node_interface()}", "cluster.cpus_per_task=1",
               f"cluster.gpus_per_node={GPUS_PER_NODE}",
               "cluster.env={OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1', "
               "OMPI_MCA_rmaps_base_oversubscribe: '1'}",
               "train.steps=2", "train.eval_interval=0", "train.checkpoint_interval=0",
               "train.checkpoint_every_s=0", "train.micro_batch_size=2", "data.corpus=synthetic")

CASES = {
    # name: (strategy, nodes, profile settings)
    "ddp-gpus-per-task": ("distributed-ps", 2, sets("cluster.gpu_request=gpus-per-task")),
    "ddp-gres-torchrun": ("distributed-ps", 2, sets("cluster.gpu_request=gres",
                                                    "cluster.launcher=torchrun")),
    # --gpu-bind=closest: these devices have no CPU affinity, so every task of a node is as
    # close to both GPUs and sees both (srun shows the same); LOCAL_RANK then picks.
    "horovod-bound": ("horovod", 2, sets("cluster.gpu_request=gpus-per-task",
                                         "cluster.gpu_bind=closest")),
    "dataparallel-gpus-per-node": ("single-ps", 1, sets("cluster.gpu_request=gpus-per-node")),
}


@pytest.fixture(scope="module")
def gpu_jobs(slurm_cluster, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    nodes = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%D %G %t"], capture_output=True,
                           text=True).stdout.split()
    if len(nodes) != 3 or "gpu:4" not in nodes[1] or nodes[2] not in ("idle", "mix", "alloc"):
        pytest.skip("the local cluster has no GPU nodes (mknod not permitted where it started, "
                    "or it started before they existed: hpcdp cluster down; hpcdp cluster up)")
    root = tmp_path_factory.mktemp("gpu")
    submitted: dict[str, tuple[Path, str]] = {}
    for name, (strategy, n, settings) in CASES.items():
        if strategy == "horovod" and not horovod_importable():
            continue
        rendered = subprocess.run(
            [sys.executable, "-m", "hpcdp", "render", "--cluster", "generic-gpu",
             "--strategy", strategy, "--nodes", str(n), "--out", str(root / name),
             *ADAPTED, *settings], cwd=root, capture_output=True, text=True)
        assert rendered.returncode == 0, rendered.stderr
        script = Path(rendered.stdout.split()[0])
        job = subprocess.run(["sbatch", "--parsable", str(script)], cwd=root,
                             capture_output=True, text=True)
        assert job.returncode == 0, f"{name}: {job.stderr}"
        submitted[name] = (script, job.stdout.strip().split(";")[0])
    infos = wait_all([job for _, job in submitted.values()], timeout_s=600)
    return {name: (script.parent, infos[job]) for name, (script, job) in submitted.items()}


def placements(run_dir: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in (run_dir / "ranks").glob("rank-*.json")),
                  key=lambda r: r["rank"])


def hints_by_node(ranks: list[dict]) -> dict[str, list[str]]:
    """Each node's ranks' predicted devices ("cuda:1"), sorted."""
    by_node: dict[str, list[str]] = {}
    for r in ranks:
        by_node.setdefault(r["node"], []).append(r["device_hint"].split()[0])
    return {node: sorted(hints) for node, hints in by_node.items()}


def finished(gpu_jobs, name: str) -> tuple[Path, list[dict]]:
    if name not in gpu_jobs:
        pytest.skip(f"{name}: Horovod is not installed (scripts/install-horovod.sh)")
    run_dir, info = gpu_jobs[name]
    assert info.state == "COMPLETED", f"{info}\n{logs(run_dir)[-3000:]}"
    assert records(run_dir)[-1]["kind"] == "summary"
    return run_dir, placements(run_dir)


def test_gpus_per_task_gives_each_rank_one_gpu_of_its_own(gpu_jobs):
    run_dir, ranks = finished(gpu_jobs, "ddp-gpus-per-task")
    script = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --gpus-per-task=1" in script
    assert len(ranks) == 4 and len({r["node"] for r in ranks}) == 2, ranks
    for node in {r["node"] for r in ranks}:
        on_node = [r for r in ranks if r["node"] == node]
        assert sorted(r["cuda_visible_devices"] for r in on_node) == ["0", "1"], on_node
    for r in ranks:  # one GPU each: index 0 of what the task sees, whatever its local rank
        assert r["device_hint"] == f"cuda:0 (CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']})"
        assert r["device"] == "cpu"  # no driver behind the device files


def test_gres_with_torchrun_shares_the_nodes_gpus_one_per_local_rank(gpu_jobs):
    run_dir, ranks = finished(gpu_jobs, "ddp-gres-torchrun")
    script = (run_dir / "job.sbatch").read_text()
    assert f"#SBATCH --gres=gpu:{GPUS_PER_NODE}" in script and "torch.distributed.run" in script
    assert len(ranks) == 4 and len({r["node"] for r in ranks}) == 2, ranks
    for r in ranks:  # every worker of a node's torchrun sees the node's GPUs: LOCAL_RANK picks
        assert r["cuda_visible_devices"] == "0,1", r
    by_node = hints_by_node(ranks)
    assert all(hints == ["cuda:0", "cuda:1"] for hints in by_node.values()), by_node


def test_horovod_over_srun_pmix_bound_closest_gets_one_gpu_per_local_rank(gpu_jobs):
    run_dir, ranks = finished(gpu_jobs, "horovod-bound")
    script = (run_dir / "job.sbatch").read_text()
    assert "--mpi=pmix" in script and "#SBATCH --gpu-bind=closest" in script
    assert len(ranks) == 4, ranks
    assert all(r["cuda_visible_devices"] == "0,1" for r in ranks), ranks
    by_node = hints_by_node(ranks)
    assert all(hints == ["cuda:0", "cuda:1"] for hints in by_node.values()), by_node


def test_dataparallel_is_one_task_with_every_gpu_of_its_node(gpu_jobs):
    run_dir, ranks = finished(gpu_jobs, "dataparallel-gpus-per-node")
    assert f"#SBATCH --gpus-per-node={GPUS_PER_NODE}" in (run_dir / "job.sbatch").read_text()
    assert len(ranks) == 1, ranks
    assert ranks[0]["cuda_visible_devices"] == "0,1"
    assert ranks[0]["device_hint"].startswith("cuda:0 ")  # DataParallel's server, device_ids[0]
