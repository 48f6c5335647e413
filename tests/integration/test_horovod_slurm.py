"""Horovod launched from Slurm's own allocation on the local two-node cluster, through hpcdp:
both controllers (MPI through `srun --mpi=pmix`, Gloo with train/'s rendezvous) with two ranks
per node, and a rendered script sbatch'ed by hand. No host list anywhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import slurm_jobs
from horovod_probe import SKIP_REASON, horovod_importable

pytestmark = [pytest.mark.slurm, pytest.mark.horovod]

FAST = ["--set", "train.steps=6", "--set", "train.eval_interval=0",
        "--set", "train.checkpoint_interval=0", "--set", "train.micro_batch_size=4",
        "--set", "data.corpus=synthetic"]


@pytest.fixture(scope="module", autouse=True)
def needs_horovod():
    if not horovod_importable():
        pytest.skip(SKIP_REASON)


def submit(tmp_path: Path, strategy: str, controller: str, ranks_per_node: int) -> tuple[str, Path]:
    out = tmp_path / f"{controller}-{ranks_per_node}"
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "submit", "--strategy", strategy, "--nodes", "2",
         "--out", str(out), "--set", f"cluster.horovod_controller={controller}",
         "--set", f"cluster.cpu_ranks_per_node={ranks_per_node}", *FAST],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    job_id = re.search(r"submitted job (\d+)", result.stdout).group(1)
    run_dir = Path(re.search(r"run:\s+(\S.*)", result.stdout).group(1).strip())
    return job_id, run_dir


def wait_all(job_ids: list[str], timeout_s: float = 600) -> dict[str, str]:
    return {job: info.state for job, info in slurm_jobs.wait_all(job_ids, timeout_s).items()}


def check_run(run_dir: Path, job_id: str, world: int, controller: str) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    header, summary = records[0], records[-1]
    assert header["kind"] == "header" and summary["kind"] == "summary"
    assert header["world_size"] == world and header["nodes"] == 2
    assert header["slurm_job_id"] == job_id
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 6 and all(r["loss"] > 0 for r in steps)
    assert steps[-1]["loss"] < steps[0]["loss"]
    # every rank's own work (its step less its synchronize), gathered with the loss
    assert all(r["rank_work_s"]["ranks"] == world and r["rank_work_s"]["min"] > 0
               for r in steps)
    assert summary["status"] == "completed" and summary["replicas_identical"] is True
    log = (run_dir / f"slurm-{job_id}.out").read_text()
    assert f"({controller})" in log, log[-2000:]  # the controller Horovod really used
    # train.malloc: auto keeps glibc's malloc where Open MPI interposes the memory functions.
    from train import malloc

    assert header["malloc"] == malloc.choose("auto", uses_mpi=controller == "mpi")[0]
    if controller == "mpi":
        assert header["malloc"] == "system"
    return summary


# Two ranks per node only: it has both Horovod's local and cross ranks, so it holds the one
# rank per node layout's rendezvous too (that layout is trained over MPI by
# test_resume_every_strategy.py). horovod-apex is resumed over MPI there and trained in
# test_train_strategies.py: precision does not change the layout.
@pytest.mark.parametrize("strategy, layouts", [("horovod", (2,))])
def test_horovod_on_two_nodes_both_controllers_both_layouts(strategy, layouts, slurm_cluster,
                                                            tmp_path):
    runs = {}
    for controller in ("mpi", "gloo"):
        for ranks_per_node in layouts:
            runs[(controller, ranks_per_node)] = submit(tmp_path, strategy, controller,
                                                        ranks_per_node)
    states = wait_all([job_id for job_id, _ in runs.values()])
    for (controller, ranks_per_node), (job_id, run_dir) in runs.items():
        log = run_dir / f"slurm-{job_id}.out"
        assert states[job_id] == "COMPLETED", log.read_text()[-3000:] if log.exists() else job_id
        check_run(run_dir, job_id, 2 * ranks_per_node, controller)
        # CPU ranks over MPI must not busy-poll the cores they compute on.
        yields = "Open MPI yields the CPU while it waits" in log.read_text()
        assert yields == (controller == "mpi"), log.read_text()[-2000:]
    # Same global batch per layout: MPI and Gloo must train the same model.
    for ranks_per_node in layouts:
        loss_mpi = step_losses(runs[("mpi", ranks_per_node)][1])
        loss_gloo = step_losses(runs[("gloo", ranks_per_node)][1])
        assert loss_mpi == pytest.approx(loss_gloo, rel=1e-3)


def step_losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "step"]


def test_rendered_horovod_script_runs_by_hand_with_sbatch(slurm_cluster, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--strategy", "horovod", "--nodes", "2",
         "--out", str(tmp_path / "runs"), *FAST], cwd=tmp_path, capture_output=True, text=True,
        check=True)
    script = Path(result.stdout.strip())
    assert "-H " not in script.read_text() and "horovodrun" not in script.read_text()
    sbatch = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                            text=True, check=True, cwd=tmp_path)
    job_id = sbatch.stdout.strip()
    assert wait_all([job_id])[job_id] == "COMPLETED", slurm_jobs.logs(script.parent)[-3000:]
    check_run(script.parent, job_id, 2, "mpi")
