"""Rendering: golden scripts per strategy, shell syntax, quoting, and that the CLI stays light."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import config, folder_checks, render, strategies
from hpcdp.errors import UsageError

GOLDEN = Path(__file__).parent.parent / "golden"
REGENERATE = "HPCDP_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_render.py"


def _render(strategy: str, nodes: int, cluster: str, tmp_path: Path, **over) -> str:
    overrides = {"python": "/opt/venv/bin/python", **over}
    profile = config.load_profile(cluster, overrides)
    experiment = config.load_experiment("smoke")
    old = os.getcwd()
    os.chdir(tmp_path)  # the scripts cd into the directory they were rendered from
    try:
        job = render.render_job(profile, experiment, strategies.get(strategy), nodes,
                                output_dir="/runs")
    finally:
        os.chdir(old)
    return job.text.replace(str(tmp_path), "/WORKDIR")


CASES = [(s.name, 1 if s.max_nodes == 1 else 2, "generic-gpu") for s in strategies.STRATEGIES]
CASES += [("horovod", 2, "local")]


def test_golden_names_match_the_registry():
    golden = {p.stem.split("@")[0] for p in GOLDEN.glob("*.sbatch")} - {"campaign"}
    assert golden == set(strategies.NAMES)  # campaign@local: tests/unit/test_campaign.py


@pytest.mark.parametrize("strategy,nodes,cluster", CASES)
def test_golden_script(strategy, nodes, cluster, tmp_path, matches_golden):
    text = _render(strategy, nodes, cluster, tmp_path)
    matches_golden(text, GOLDEN / f"{strategy}@{cluster}.sbatch", REGENERATE)


@pytest.mark.parametrize("strategy,nodes,cluster", CASES)
def test_scripts_pass_bash_syntax_check(strategy, nodes, cluster, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(_render(strategy, nodes, cluster, tmp_path))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_directives_follow_the_profile(tmp_path):
    text = _render("distributed-ps", 2, "generic-gpu", tmp_path, gpu_request="gpus-per-node",
                   gpu_type="v100", account="proj42", qos="high")
    lines = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=4" in lines  # one rank per GPU
    assert "#SBATCH --gpus-per-node=v100:4" in lines
    assert "#SBATCH --account=proj42" in lines and "#SBATCH --qos=high" in lines
    single = _render("single-gpu", 1, "generic-gpu", tmp_path)
    assert "#SBATCH --gres=gpu:1" in single and "#SBATCH --ntasks-per-node=1" in single
    dp = _render("single-ps", 1, "generic-gpu", tmp_path)
    assert "#SBATCH --gres=gpu:4" in dp and "#SBATCH --ntasks-per-node=1" in dp


def test_gpus_per_task_asks_each_task_for_its_own_gpus(tmp_path):
    def directives(strategy: str, **profile) -> list[str]:
        text = _render(strategy, 1 if strategy.startswith("single") else 2, "generic-gpu", tmp_path,
                       gpu_request="gpus-per-task", **profile)
        return [line for line in text.splitlines() if line.startswith("#SBATCH --gpu")]

    assert directives("distributed-ps", gpu_bind="closest") == [
        "#SBATCH --gpus-per-task=1", "#SBATCH --gpu-bind=closest"]
    assert directives("horovod", gpu_type="h100") == ["#SBATCH --gpus-per-task=h100:1"]
    assert directives("single-gpu") == ["#SBATCH --gpus-per-task=1"]
    assert directives("single-ps") == ["#SBATCH --gpus-per-task=4"]  # DataParallel: all four
    with pytest.raises(UsageError, match="cluster.gpu_bind 'map_gpu:0 1' may hold only"):
        _render("distributed-ps", 2, "generic-gpu", tmp_path, gpu_request="gpus-per-task",
                gpu_bind="map_gpu:0 1")


def test_torchrun_launcher_starts_one_torchrun_per_node_for_ddp_only(tmp_path):
    text = _render("distributed-ps", 2, "local", tmp_path, cpu_ranks_per_node=2,
                   launcher="torchrun")
    launch = [line.strip() for line in text.splitlines() if line.lstrip().startswith("srun ")]
    assert launch == [
        'srun --nodes=2 --ntasks=2 --ntasks-per-node=1'
        ' --cpus-per-task="${NODE_CPUS:-${SLURM_CPUS_ON_NODE:-1}}"'
        ' ${HPCDP_CAMPAIGN:+--exact} --kill-on-bad-exit=1 "$PYTHON" -m torch.distributed.run'
        ' --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d'
        ' --rdzv-endpoint="$RDZV_HOST:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" -m train'
        ' "${TRAIN_ARGS[@]}" &']
    assert "#SBATCH --ntasks-per-node=2" in text  # the allocation is the same as with srun
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    for strategy in ("horovod", "single-gpu"):
        other = _render(strategy, 1, "local", tmp_path, launcher="torchrun")
        assert "torch.distributed.run" not in other


def _torchrun_threads(text: str, environ: dict[str, str]) -> tuple[str, str]:
    """Run the script's lines that set torchrun's threads; (OMP_NUM_THREADS, NODE_CPUS)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("THREADS="))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("NODE_CPUS="))
    code = "\n".join(["set -euo pipefail", *lines[start:end + 1],
                      'echo "$OMP_NUM_THREADS ${NODE_CPUS:-}"'])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS",
                                                             "SRUN_CPUS_PER_TASK")}
    out = subprocess.run(["bash", "-c", code], env={**env, **environ}, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], (out[1] if len(out) > 1 else "")


@pytest.mark.parametrize("cpus_per_task", [None, 3])
def test_torchrun_ranks_get_the_threads_srun_ranks_get(tmp_path, cpus_per_task):
    """torchrun's own default is one thread per rank; srun's ranks follow
    distenv.threads_per_process. Both launchers now give a rank the same count, alone and in a
    campaign (which sets SRUN_CPUS_PER_TASK), and torchrun's task takes its ranks' CPUs."""
    from hpcdp import distenv

    text = _render("distributed-ps", 2, "local", tmp_path, cpu_ranks_per_node=2,
                   launcher="torchrun", cpus_per_task=cpus_per_task)
    srun_rank = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
                 "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
                 "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "node[1-2]",
                 **({"SLURM_CPUS_PER_TASK": str(cpus_per_task)} if cpus_per_task else {})}
    alone = distenv.threads_per_process(distenv.detect(srun_rank), srun_rank)
    assert _torchrun_threads(text, {}) == (str(alone), "")
    in_campaign = {**srun_rank, "SLURM_CPUS_PER_TASK": "5"}  # srun's, from SRUN_CPUS_PER_TASK
    threads = distenv.threads_per_process(distenv.detect(in_campaign), in_campaign)
    assert _torchrun_threads(text, {"SRUN_CPUS_PER_TASK": "5"}) == (str(threads), "10")
    assert _torchrun_threads(text, {"OMP_NUM_THREADS": "7"})[0] == "7"  # a user's own wins


def test_cpu_profile_uses_cpu_ranks_per_node(tmp_path):
    text = _render("distributed-ps", 2, "local", tmp_path, cpu_ranks_per_node=2)
    assert "#SBATCH --ntasks-per-node=2" in text
    assert "    --expect-world 4\n    --expect-tasks-per-node 2\n" in text
    assert "--gres" not in text and "--gpus-per-node" not in text


def test_every_value_in_the_body_is_quoted(tmp_path):
    payload = "x'; touch /tmp/PWNED-hpcdp; echo '$(id)`id`"
    text = _render("distributed-ps", 1, "local", tmp_path, env={"MY_VAR": payload},
                   modules=[payload], python=payload)
    import shlex
    assert f"export MY_VAR={shlex.quote(payload)}" in text
    assert f"module load {shlex.quote(payload)}" in text
    assert f"PYTHON={shlex.quote(payload)}" in text


def test_newline_in_output_dir_is_refused(tmp_path):
    from hpcdp.errors import UsageError
    profile = config.load_profile("local")
    experiment = config.load_experiment("smoke")
    with pytest.raises(UsageError, match="newline"):
        render.render_job(profile, experiment, strategies.get("ddp"), 1, output_dir="/tmp/a\nb")


@pytest.mark.parametrize("name", ["paper", "smoke"])
@pytest.mark.parametrize("cluster", ["local", "generic-gpu"])
def test_every_shipped_experiment_renders_its_matrix(name, cluster, tmp_path):
    profile = config.load_profile(cluster)
    experiment = config.load_experiment(name)
    cells = experiment.matrix.cells()
    assert cells
    for strategy, nodes in cells:
        job = render.render_job(profile, experiment, strategy, nodes, output_dir=str(tmp_path))
        assert f"#SBATCH --nodes={nodes}" in job.text


def test_paper_matrix_has_the_papers_cells():
    experiment = config.load_experiment("paper")
    cells = {(s.name, n) for s, n in experiment.matrix.cells()}
    assert ("single-gpu", 1) in cells and ("single-gpu", 2) not in cells
    assert {("horovod-apex", n) for n in (1, 2, 4)} <= cells
    assert len(cells) == 2 + 4 * 3


@pytest.mark.parametrize("argv", [["--help"], ["render", "--stdout", "-s", "ddp", "-N", "2"],
                                  ["submit", "--dry-run", "-s", "horovod-apex", "-N", "2"],
                                  ["strategies"], ["status"], ["env", "--json"],
                                  ["cluster", "env"], ["harvest", ".", "--no-slurm"],
                                  ["forecast", ".", "--no-slurm"],
                                  ["render", "--stdout", "-s", "ddp", "-N", "2", "--set",
                                   "train.trackers=[tensorboard,mlflow,wandb]"]])
def test_cli_never_imports_torch_or_transformers(argv, tmp_path):
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['hpcdp', *{argv!r}]\n"
        "try:\n    runpy.run_module('hpcdp', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy', 'horovod', 'matplotlib',\n"
        "                          'submitit', 'tensorboard', 'mlflow', 'wandb')\n"
        "               if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert "HEAVY=\n" in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("limit, lead", [("2", 12), ("00:20:00", 120), ("1-00", 120),
                                         ("5:00", 30), ("0:30", 3)])
def test_the_requeue_signal_lead_scales_with_a_short_time_limit(limit, lead):
    """A 2-minute limit with the old fixed 120 s lead signalled at once and requeued the job
    to death: the lead is a tenth of the limit, at most 120 s (or cluster.signal_lead_s)."""
    profile = config.load_profile("local", {"time_limit": limit})
    lines = render.sbatch_directives(profile, strategies.get("ddp"), 2, "x")
    assert f"--signal=B:USR2@{lead}" in lines
    fixed = config.load_profile("local", {"time_limit": limit, "signal_lead_s": 1})
    assert "--signal=B:USR2@1" in render.sbatch_directives(fixed, strategies.get("ddp"), 2, "x")


def test_extra_sbatch_values_with_spaces_are_quoted_as_sbatch_reads_them():
    profile = config.load_profile("local", {"extra_sbatch": ["--comment=a b", "--exclusive"]})
    lines = render.sbatch_directives(profile, strategies.get("ddp"), 2, "x")
    assert '--comment="a b"' in lines and "--exclusive" in lines


def test_an_exclusion_list_interface_is_not_handed_to_gloo(tmp_path):
    """NCCL reads `^docker0,lo`; Gloo reads interface names only and broke on it. The script
    exports it for NCCL, and train/ resolves Gloo's interface on each node."""
    text = _render("distributed-ps", 2, "local", tmp_path, network_interface="^docker0,lo")
    assert "export NCCL_SOCKET_IFNAME='^docker0,lo'" in text
    assert "GLOO_SOCKET_IFNAME" not in text
    plain = _render("distributed-ps", 2, "local", tmp_path, network_interface="=eth0")
    assert "export GLOO_SOCKET_IFNAME=eth0" in plain
    mine = _render("distributed-ps", 2, "local", tmp_path, network_interface="^lo",
                   env={"GLOO_SOCKET_IFNAME": "ib1"})
    assert "export GLOO_SOCKET_IFNAME=ib1" in mine  # the profile's own value wins


def test_a_matrix_prepare_job_asks_one_task_with_a_nodes_cpus_and_no_gpu(tmp_path):
    profile = config.load_profile("generic-gpu", {"python": "/opt/venv/bin/python"})
    job = render.render_prepare_job(profile, config.load_experiment("smoke"),
                                    output_dir=str(tmp_path / "runs"))
    assert job.run_dir == tmp_path / "runs" / "smoke" / "prepare"
    directives = [line for line in job.text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1" in directives and "#SBATCH --ntasks-per-node=1" in directives
    assert "#SBATCH --cpus-per-task=32" in directives  # 8 per rank x 4 GPUs' ranks
    assert not any(d.startswith(("#SBATCH --gres", "#SBATCH --gpus", "#SBATCH --requeue",
                                 "#SBATCH --signal")) for d in directives), directives
    assert '"$PYTHON" -m train prepare --experiment "$EXPERIMENT"' in job.text
    assert not [line for line in job.text.splitlines() if line.lstrip().startswith("srun ")]
    script = tmp_path / "prepare.sbatch"
    script.write_text(job.text)
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_submit_dry_run_of_a_matrix_lists_the_prepare_job_first(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hpcdp", "submit", "--experiment", "smoke",
                           "--dry-run", "--out", str(tmp_path / "runs")], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    plans = [line for line in done.stdout.splitlines() if line.startswith("# would submit")]
    assert plans[0].startswith("# would submit: sbatch /")
    assert "/smoke/prepare/job.sbatch" in plans[0]
    assert all("--dependency=afterok:<prepare job>" in line for line in plans[1:])
    assert len(plans) == 1 + len(config.load_experiment("smoke").matrix.cells())
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_from_before_a_new_setting_is_still_continued(tmp_path):
    """A run written by an older hpcdp lacks fields added since (here data.text_field): they
    take today's defaults, so resubmitting it continues it. A setting that changed still
    refuses."""
    import yaml

    experiment = config.load_experiment("smoke")
    job = render.render_job(config.load_profile("local"), experiment,
                            strategies.get("single-gpu"), 1, output_dir=str(tmp_path))
    job.run_dir.mkdir(parents=True)
    (job.run_dir / "metrics.jsonl").write_text('{"kind": "header"}\n')
    older = config.as_dict(experiment)
    del older["data"]["text_field"]
    job.experiment_file.write_text(yaml.safe_dump(older))
    folder_checks.check_continuable([job], experiment)  # no error
    older["train"]["lr"] = 1.0
    job.experiment_file.write_text(yaml.safe_dump(older))
    with pytest.raises(UsageError, match="holds a run trained with train.lr=1.0"):
        folder_checks.check_continuable([job], experiment)


def test_the_modern_experiment_renders_a_gpu_campaign_of_every_strategy(tmp_path):
    """experiments/modern.yaml: the paper's six and the sharded ones on 1, 2 and 4 GPU nodes."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hpcdp", "compare", "--experiment", "modern",
                           "--cluster", "generic-gpu", "--dry-run"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "(182 cells; nothing written, nothing submitted)" in done.stdout  # 26 x 7 repeats
    for spec in strategies.STRATEGIES:  # the one-node strategies on 1 node only
        assert f"{spec.name}-{spec.max_nodes or 4}n-r1" in done.stdout, spec.name
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
