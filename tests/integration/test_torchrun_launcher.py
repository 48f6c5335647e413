"""Profile `launcher: torchrun` (issue 12, item 1): srun starts one torchrun per node, torchrun
starts the node's DDP ranks, and the job trains as the srun-launched one does."""

from __future__ import annotations

import subprocess
import sys

import pytest
from slurm_jobs import logs, records, sets, submit, wait_all

pytestmark = pytest.mark.slurm

# Strong scaling: one global batch of 16 sequences whatever the world, so the srun reference
# can be 2 nodes of 1 rank (micro-batches of 4, two accumulated) against torchrun's 2 x 2 (one
# micro-batch each): the same samples and the same mean gradient, 2 rank starts fewer. Summed
# in another order, so close, not bit-identical (test_compare.py measures strong scaling the
# same way). srun's own 2 x 2 layout is trained in test_sharded_strategies.py (hsdp).
SETTINGS = sets("train.steps=8", "train.log_interval=1", "train.eval_interval=0",
                "train.checkpoint_interval=0", "train.scaling=strong",
                "train.global_batch_size=16", "train.micro_batch_size=4")
RANKS_PER_NODE = {"torchrun": 2, "srun": 1}


def test_two_nodes_of_two_torchrun_ranks_train_like_srun_ranks(slurm_cluster, tmp_path):
    jobs = {launcher: submit(tmp_path, "distributed-ps", 2, tmp_path / launcher, *SETTINGS,
                             *sets(f"cluster.launcher={launcher}",
                                   f"cluster.cpu_ranks_per_node={RANKS_PER_NODE[launcher]}"))
            for launcher in ("torchrun", "srun")}
    infos = wait_all([job_id for job_id, _ in jobs.values()])
    for launcher, (job_id, run_dir) in jobs.items():
        assert infos[job_id].state == "COMPLETED", (launcher, logs(run_dir)[-3000:])
    script = (jobs["torchrun"][1] / "job.sbatch").read_text()
    assert ("-m torch.distributed.run --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d"
            in script)
    headers = {launcher: records(run_dir)[0] for launcher, (_, run_dir) in jobs.items()}
    assert headers["torchrun"]["launcher"] == "torchrun"
    assert headers["srun"]["launcher"] == "slurm"
    for launcher, header in headers.items():
        ranks = RANKS_PER_NODE[launcher]
        assert (header["world_size"], header["nodes"], header["tasks_per_node"]) == (
            2 * ranks, 2, ranks)
        assert header["global_batch_size"] == 16
    losses = {launcher: [r["loss"] for r in records(run_dir) if r["kind"] == "step"]
              for launcher, (_, run_dir) in jobs.items()}
    assert len(losses["torchrun"]) == 8
    assert losses["torchrun"] == pytest.approx(losses["srun"], rel=1e-4)


def test_horovod_keeps_srun_under_a_torchrun_profile(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--strategy", "horovod", "--nodes", "2",
         "--cluster", "local", "--stdout", *sets("cluster.launcher=torchrun")],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "torch.distributed.run" not in result.stdout
    assert "srun --mpi=pmix --nodes=2" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "hpcdp", "render", "--strategy", "ddp",
                          "--stdout", *sets("cluster.launcher=mpirun")], cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cluster.launcher" in bad.stderr and "torchrun" in bad.stderr
