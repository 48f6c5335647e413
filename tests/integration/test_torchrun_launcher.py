"""Profile `launcher: torchrun` (issue 12, item 1): srun starts one torchrun per node, torchrun
starts the node's DDP ranks, and the job trains as the srun-launched one does."""

from __future__ import annotations

import subprocess
import sys

import pytest
from slurm_jobs import logs, records, sets, submit, wait_all

pytestmark = pytest.mark.slurm

SETTINGS = sets("train.steps=8", "train.log_interval=1", "train.eval_interval=0",
                "train.checkpoint_interval=0", "cluster.cpu_ranks_per_node=2")


def test_two_nodes_of_two_torchrun_ranks_train_like_srun_ranks(slurm_cluster, tmp_path):
    jobs = {launcher: submit(tmp_path, "distributed-ps", 2, tmp_path / launcher, *SETTINGS,
                             *sets(f"cluster.launcher={launcher}"))
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
    for header in headers.values():
        assert (header["world_size"], header["nodes"], header["tasks_per_node"]) == (4, 2, 2)
    losses = {launcher: [r["loss"] for r in records(run_dir) if r["kind"] == "step"]
              for launcher, (_, run_dir) in jobs.items()}
    assert len(losses["torchrun"]) == 8
    assert losses["torchrun"] == pytest.approx(losses["srun"], rel=1e-5)


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
