"""Issue 22: jobs whose steps run inside a real container runtime on the local cluster.

The runtime is Slurm's own OCI support (`srun --container=BUNDLE`) with runc, which
`hpcdp cluster up` configures where runc can start a container (scripts/slurm-oci.py); the
bundle's root file system is this machine's own, so the image holds the same torch and Horovod
and the losses must equal those of the same job outside. Apptainer and Pyxis cannot be
installed here: their scripts are checked by golden tests (tests/unit/test_containers_render.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from slurm_jobs import logs, records, sets, submit, wait_all, wait_for_step

from hpcdp import harvest, strategies

# On the gpu partition's two nodes (asking for no GPU): scripts/test.sh runs these beside the
# debug partition's tests.
pytestmark = [pytest.mark.slurm, pytest.mark.gpu_partition]

PAUSE_AT = 3  # the stopped job's last step before the time-limit signal
# Strong scaling: the torchrun job's 4 ranks train the same global batch as the others' 2.
SETTINGS = sets("train.steps=6", "train.log_interval=1", "train.eval_interval=0",
                "train.checkpoint_interval=0", "cluster.horovod_controller=gloo",
                "train.scaling=strong", "train.global_batch_size=16", "train.micro_batch_size=4")


@pytest.fixture(scope="module")
def partition(slurm_cluster) -> str:
    """The gpu partition (its jobs ask for no GPU): scripts/test.sh runs these tests beside the
    debug partition's, whose nodes they must not take."""
    nodes = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%D"], capture_output=True,
                           text=True).stdout.strip()
    if not nodes:
        pytest.skip("the local cluster has no gpu partition (mknod not permitted where it "
                    "started), and these jobs must not take the debug nodes the Slurm tests "
                    "beside them use")
    return "gpu"


@pytest.fixture(scope="module")
def bundle(slurm_cluster):
    if not (slurm_cluster / "etc" / "oci.conf").exists():
        pytest.skip("the local cluster has no container runtime: `hpcdp cluster up` found no "
                    "runc that can start a container here (apt-get install runc)")
    return slurm_cluster / "oci" / "host-bundle"


def _inside(bundle) -> list[str]:
    # The image's `python` would be the system's; this one has torch.
    return sets("cluster.container.runtime=oci", f"cluster.container.image={bundle}",
                f"cluster.python={sys.executable}")


@pytest.fixture(scope="module")
def settings(partition) -> list[str]:
    return [*SETTINGS, *sets(f"cluster.partition={partition}")]


def test_hpcdp_env_inside_the_container_shows_each_rank_its_place(bundle, partition, tmp_path):
    result = subprocess.run(
        ["srun", "--nodes=2", "--ntasks=2", f"--container={bundle}", f"--partition={partition}",
         f"--output={tmp_path}/env-%t.json", "env", f"--chdir={tmp_path}", sys.executable,
         "-m", "hpcdp", "env", "--json"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    views = sorted((json.loads(path.read_text()) for path in tmp_path.glob("env-*.json")),
                   key=lambda view: view["rank"])
    assert [(v["rank"], v["world_size"], v["node_rank"], v["local_rank"]) for v in views] == [
        (0, 2, 0, 0), (1, 2, 1, 0)]
    assert {v["container"] for v in views} == {f"oci {bundle} (SLURM_CONTAINER)"}
    assert views[0]["master_addr"] == views[1]["master_addr"]


@pytest.fixture(scope="module")
def runs(bundle, settings, tmp_path_factory):
    """The jobs inside and outside, submitted at once; "ddp inside" pauses after step PAUSE_AT
    until the time-limit signal (USR2 to the batch shell) stops it, and requeues: its losses
    equal those outside bit for bit only if the container and the resume both keep the maths
    (one run of 2 ranks fewer than an uninterrupted run inside as well)."""
    tmp = tmp_path_factory.mktemp("containers")
    jobs = {
        "ddp outside": submit(tmp, "distributed-ps", 2, tmp / "out", *settings),
        "horovod inside": submit(tmp, "horovod", 2, tmp / "in", *settings, *_inside(bundle)),
        # Slurm 22.05 runs one container task per node: torchrun starts the node's two ranks.
        "torchrun inside": submit(tmp, "distributed-ps", 2, tmp / "torchrun", *settings,
                                  *_inside(bundle), *sets("cluster.launcher=torchrun",
                                                          "cluster.cpu_ranks_per_node=2")),
        "ddp inside": submit(tmp, "distributed-ps", 2, tmp / "stopped", *settings,
                             *_inside(bundle), env={"HPCDP_FAULT": f"pause@{PAUSE_AT}"}),
    }
    stopped_id, stopped_dir = jobs["ddp inside"]
    wait_for_step(stopped_dir, PAUSE_AT)
    subprocess.run(["scancel", "--batch", "--signal=USR2", stopped_id], check=True)
    infos = wait_all([job_id for job_id, _ in jobs.values()])
    for name, (job_id, run_dir) in jobs.items():
        assert infos[job_id].state == "COMPLETED", (name, logs(run_dir)[-3000:])
    return tmp, jobs, infos


def _losses(run_dir) -> list[float]:
    """Each step's loss in step order; a step logged twice (resumed) counts its last record."""
    by_step = {r["step"]: r["loss"] for r in records(run_dir) if r["kind"] == "step"}
    return [by_step[step] for step in sorted(by_step)]


def test_ddp_and_horovod_train_inside_as_ddp_does_outside(bundle, runs):
    tmp, jobs, _ = runs
    headers = {name: records(run_dir)[0] for name, (_, run_dir) in jobs.items()}
    assert headers["ddp outside"]["container"] is None
    for name in ("ddp inside", "horovod inside", "torchrun inside"):
        assert headers[name]["container"] == f"oci {bundle}", name
        assert headers[name]["nodes"] == 2 and headers[name]["global_batch_size"] == 16
    assert headers["ddp inside"]["world_size"] == headers["horovod inside"]["world_size"] == 2
    assert (headers["torchrun inside"]["world_size"], headers["torchrun inside"]["launcher"]) == (
        4, "torchrun")
    assert headers["horovod inside"]["communication"] == "horovod-gloo"
    script = (jobs["ddp inside"][1] / "job.sbatch").read_text()
    assert f'CONTAINER_SRUN=(--container={bundle})' in script
    losses = {name: _losses(run_dir) for name, (_, run_dir) in jobs.items()}
    assert len(losses["ddp outside"]) == 6
    # The same code on the same bits, stopped at PAUSE_AT and resumed (the last record of a step
    # counts): bit-identical.
    assert losses["ddp inside"] == losses["ddp outside"]
    # Horovod's all-reduce sums in another order than gloo's DDP buckets: equal to rounding.
    assert losses["horovod inside"] == pytest.approx(losses["ddp outside"], rel=1e-5)
    # 4 ranks of one micro-batch against 2 ranks accumulating two: the same batch, summed apart.
    assert losses["torchrun inside"] == pytest.approx(losses["ddp outside"], rel=1e-4)
    # harvest keeps the runs inside and outside apart: the container is one of the conditions
    result = harvest.collect([tmp / "out", tmp / "stopped"], query_slurm=False)
    ddp = [c for c in result.cells if c.strategy == "distributed-ps"]
    assert sorted(str(c.conditions[-1]) for c in ddp) == sorted(["None", f"oci {bundle}"])


def test_a_run_inside_stops_on_the_time_limit_signal_requeues_and_resumes(runs):
    """srun passes USR2 to its tasks; inside, each task is runc, which must pass it on to the
    rank (scripts/slurm-oci.py execs `runc run`, which forwards signals to the container)."""
    _, jobs, infos = runs
    stopped_id, stopped_dir = jobs["ddp inside"]
    recs = records(stopped_dir)
    assert [h["start_step"] for h in recs if h["kind"] == "header"] == [0, PAUSE_AT]
    assert infos[stopped_id].restarts == 1
    assert "requeueing job" in logs(stopped_dir)
    # Bit-identical to the run outside: test_ddp_and_horovod_train_inside_as_ddp_does_outside.


@pytest.mark.parametrize("profile", ["apptainer-gpu", "ngc-pyxis"])
def test_the_container_gpu_profiles_pass_sbatch_test_only(slurm_cluster, tmp_path, profile):
    """Every strategy of the registry, on 1 node and, where it spans nodes, on 2: each script
    the example profile renders is accepted by `sbatch --test-only` on the gpu partition (its
    #SBATCH lines fit; nothing runs), and each of its Python lines starts inside the image."""
    gres = subprocess.run(["sinfo", "-h", "-p", "gpu", "-o", "%G"], capture_output=True,
                          text=True).stdout
    if "gpu:4" not in gres:
        pytest.skip("the local cluster has no GPU nodes (mknod not permitted where it started)")
    image = tmp_path / "hpcdp-pytorch.sif"
    image.write_bytes(b"")
    # The gpu partition's nodes have 4 GPUs and 4 CPUs each; hsdp's 4 ranks per node shard.
    over = sets("cluster.gpus_per_node=4", "cluster.cpus_per_task=1",
                "matrix.strategies=[" + ",".join(s.name for s in strategies.STRATEGIES) + "]",
                "matrix.nodes=[1,2]")
    if profile == "apptainer-gpu":
        over += sets(f"cluster.container.image={image}")
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--cluster", profile, "--out",
         str(tmp_path / "runs"), *over], cwd=tmp_path, capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    cells = {f"{s.name}-{n}n" for s in strategies.STRATEGIES for n in (1, 2)
             if s.max_nodes is None or n <= s.max_nodes}
    scripts = {p.parent.name: p for p in (tmp_path / "runs" / "smoke").glob("*/job.sbatch")}
    assert set(scripts) == cells
    marker = '"${CONTAINER_SRUN[@]}"' if profile == "ngc-pyxis" else '"${CONTAINER_EXEC[@]}"'
    refused = {}
    for cell, script in sorted(scripts.items()):
        text = script.read_text()
        python_lines = [line.strip() for line in text.splitlines() if '"$PYTHON"' in line]
        assert "#SBATCH --partition=gpu" in text and python_lines, cell
        assert all(line.startswith("srun ") and marker in line for line in python_lines), cell
        test = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True,
                              text=True, timeout=60)
        if test.returncode != 0 or "to start at" not in test.stderr:
            refused[cell] = test.stderr.strip()
    assert not refused, f"{profile}: sbatch --test-only refused {refused}"
