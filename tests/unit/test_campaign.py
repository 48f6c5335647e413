"""hpcdp compare's plan and script, without Slurm: the order (one round per repeat), its seed,
the allocation's size, one allocator for every cell, --exclusive, the network probes at both
ends, the cells' own scripts, shell syntax, the retry of a failed cell (the script run by bash
with cells that fail on purpose), and that a dry run writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT, campaign, config


def _plan(tmp_path: Path, cluster: str = "local", experiment: str = "smoke", **experiment_over):
    profile = config.load_profile(cluster, {"output_dir": str(tmp_path / "runs")})
    exp = config.load_experiment(experiment, experiment_over)
    return campaign.plan(profile, exp)


def _keys(plan: campaign.Campaign) -> list[str]:
    return [c.key for c in plan.cells]


def test_every_cell_repeated_once_per_repeat(tmp_path):
    plan = _plan(tmp_path, compare={"repeats": 2, "seed": 5})
    exp = config.load_experiment("smoke")
    expected = {f"{s.name}-{n}n-r{k}" for s, n in exp.matrix.cells() for k in (1, 2)}
    assert sorted(_keys(plan)) == sorted(expected)
    assert len({c.job.run_dir for c in plan.cells}) == len(plan.cells)  # a folder each


def test_the_shuffle_is_seeded_and_as_listed_keeps_the_matrix_order(tmp_path):
    first = _keys(_plan(tmp_path, compare={"repeats": 2, "seed": 5}))
    assert first == _keys(_plan(tmp_path, compare={"repeats": 2, "seed": 5}))
    assert first != _keys(_plan(tmp_path, compare={"repeats": 2, "seed": 6}))
    listed = _plan(tmp_path, compare={"repeats": 2, "order": "as-listed"})
    assert listed.seed is None
    exp = config.load_experiment("smoke")
    assert _keys(listed) == [f"{s.name}-{n}n-r{k}" for k in (1, 2) for s, n in exp.matrix.cells()]


def test_an_unseeded_campaign_draws_a_seed_and_continuing_it_keeps_it(tmp_path):
    plan = _plan(tmp_path)
    assert isinstance(plan.seed, int)
    plan.folder.mkdir(parents=True)
    (plan.folder / campaign.CAMPAIGN_FILE).write_text(json.dumps(plan.record()))
    again = _plan(tmp_path)
    assert (again.seed, _keys(again)) == (plan.seed, _keys(plan))


def test_a_fresh_campaign_draws_a_new_seed(tmp_path):
    # issue 19, item 11: --fresh kept the moved-aside campaign's seed
    plan = _plan(tmp_path)
    plan.folder.mkdir(parents=True)
    (plan.folder / campaign.CAMPAIGN_FILE).write_text(json.dumps(plan.record()))
    profile = config.load_profile("local", {"output_dir": str(tmp_path / "runs")})
    seeds = {campaign.plan(profile, config.load_experiment("smoke"), fresh=True).seed
             for _ in range(3)}
    assert plan.seed not in seeds


def test_render_writes_the_whole_campaign_for_plain_sbatch_and_submits_nothing(tmp_path):
    # issue 19, item 9
    out = tmp_path / "runs"
    done = _hpcdp(tmp_path, "compare", "--render", "--out", str(out), "--repeats", "1",
                  "--set", "matrix.strategies=[single-gpu,distributed-ps]",
                  "--set", "matrix.nodes=[1,2]")
    assert done.returncode == 0, done.stderr
    folder = out / "smoke" / "compare"
    record = json.loads((folder / "campaign.json").read_text())
    scripts = [Path(c["run_dir"]) / "job.sbatch"
               for c in record["baseline"] + record["cells"] + record["baseline_end"]]
    assert len(scripts) == 3 + 2 and all(p.is_file() for p in scripts)  # 3 cells, 2 probes
    assert (folder / "campaign.sbatch").is_file()
    assert f"sbatch {folder / 'campaign.sbatch'}" in done.stdout
    assert not (folder / "submission.json").exists()  # nothing was submitted
    for script in [folder / "campaign.sbatch", *scripts]:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_the_allocation_is_sized_for_the_largest_cell(tmp_path):
    plan = _plan(tmp_path, cluster="generic-gpu", experiment="paper")
    largest = max(c.nodes for c in plan.cells)
    assert plan.job.nodes == largest
    assert f"#SBATCH --nodes={largest}\n" in plan.job.text
    gpus = config.load_profile("generic-gpu").gpus_per_node
    assert (f"#SBATCH --gres=gpu:{gpus}\n" in plan.job.text
            or f"#SBATCH --gpus-per-node={gpus}\n" in plan.job.text)
    assert plan.job.tasks_per_node == gpus  # the one-rank-per-GPU strategies


def test_the_script_runs_each_cells_own_script_in_the_recorded_order(tmp_path):
    plan = _plan(tmp_path, compare={"repeats": 2, "seed": 11})
    text = plan.job.text
    positions = [text.index(str(c.job.script_path)) for c in plan.cells]
    assert positions == sorted(positions)
    assert "HPCDP_CAMPAIGN=1 bash \"$3\"" in text and "seed 11" in text
    for cell in plan.cells:  # srun inside a larger allocation takes exactly the cell's size
        assert f"--nodes={cell.nodes}" in cell.job.text
        assert "${HPCDP_CAMPAIGN:+--exact}" in cell.job.text
    script = tmp_path / "campaign.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)


def _hpcdp(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})


def test_dry_run_of_the_paper_campaign_prints_it_and_writes_nothing(tmp_path):
    done = _hpcdp(tmp_path, "compare", "--experiment", "paper", "--cluster", "generic-gpu",
                  "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = _plan(tmp_path, "generic-gpu", "paper")
    assert done.stdout.count("/job.sbatch") == (len(plan.cells) + len(plan.probes)
                                                + len(plan.probes_end))
    # The network baseline: one probe per transport and node count, before the cells.
    assert sorted(c.key for c in plan.probes) == sorted(
        f"baseline-{s}-{n}n" for s in ("distributed-ps", "horovod") for n in (1, 2, 4))
    assert done.stdout.index("baseline-horovod-4n") < done.stdout.index("-r1 ")
    assert "# would submit: sbatch" in done.stdout and "#SBATCH --job-name=paper-compare" in \
        done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needle", [
    (["--strategy", "horovod"], "unrecognized arguments: --strategy"),
    (["--repeats", "0"], "--repeats"),
    (["--set", "compare.repeats=0"], "compare.repeats"),
    (["--set", "compare.order=random"], "compare.order"),
    (["--set", "compare.network_baseline=sometimes"], "compare.network_baseline"),
])
def test_bad_compare_input_is_one_line_exit_2(tmp_path, args, needle):
    done = _hpcdp(tmp_path, "compare", "--dry-run", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []


def test_each_repeat_is_one_round_that_holds_every_cell_once(tmp_path):
    """Blocked order: drift over the allocation reaches every cell alike. A whole-list shuffle
    ran both repeats of a cell back to back (seed 5 here did: the old order failed this)."""
    exp = config.load_experiment("smoke")
    matrix = [f"{s.name}-{n}n" for s, n in exp.matrix.cells()]
    orders = set()
    for seed in range(8):
        plan = _plan(tmp_path, compare={"repeats": 3, "seed": seed})
        for k in (1, 2, 3):
            block = plan.cells[(k - 1) * len(matrix):k * len(matrix)]
            assert [c.repeat for c in block] == [k] * len(matrix), seed
            assert sorted(f"{c.strategy.name}-{c.nodes}n" for c in block) == sorted(matrix)
            orders.add(tuple(c.key.rsplit("-r", 1)[0] for c in block))
    assert len(orders) > 8  # each round shuffled on its own, not one order repeated
    listed = _plan(tmp_path, compare={"repeats": 2, "order": "as-listed"})
    assert [c.key for c in listed.cells] == [f"{m}-r{k}" for k in (1, 2) for m in matrix]


def _malloc_of(job) -> str:
    import yaml
    return yaml.safe_load(job.experiment_file.read_text())["train"]["malloc"]


def test_every_cell_gets_one_allocator_and_campaign_json_records_it(tmp_path):
    """train.malloc auto gave Horovod-over-MPI cells glibc's malloc and every other cell
    tcmalloc: the campaign compared allocators. Now it resolves one for all and says so."""
    plan = _plan(tmp_path)  # smoke: Horovod under the local profile's MPI controller
    campaign.write(plan)
    mallocs = {_malloc_of(c.job) for c in plan.cells + plan.probes + plan.probes_end}
    assert mallocs == {"system"} and plan.experiment.train.malloc == "system"
    record = json.loads((plan.folder / campaign.CAMPAIGN_FILE).read_text())
    assert record["malloc"] == "system"
    assert len(plan.notes) == 1 and "horovod 1n" in plan.notes[0]
    assert "cluster.horovod_controller=gloo" in plan.notes[0]
    # No cell initialises MPI: auto, as for a job of its own, in every cell, without a note.
    other = _plan(tmp_path, matrix={"strategies": ["single-gpu", "ddp"]})
    assert other.experiment.train.malloc == "auto" and other.notes == []
    profile = config.load_profile("local", {"output_dir": str(tmp_path / "runs"),
                                            "horovod_controller": "gloo"})
    gloo = campaign.plan(profile, config.load_experiment("smoke"))
    assert gloo.experiment.train.malloc == "auto" and gloo.notes == []
    named = _plan(tmp_path / "n", train={"malloc": "tcmalloc"},
                  matrix={"strategies": ["single-gpu", "ddp"]})
    assert named.experiment.train.malloc == "tcmalloc"


def test_an_allocator_some_cells_cannot_take_is_refused_in_one_line(tmp_path):
    done = _hpcdp(tmp_path, "compare", "--set", "train.malloc=tcmalloc", "--out",
                  str(tmp_path / "runs"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "train.malloc 'tcmalloc'" in done.stderr and "horovod 2n" in done.stderr
    assert "train.malloc=system" in done.stderr and "horovod_controller=gloo" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_campaign_asks_for_whole_nodes_unless_the_profile_says_not(tmp_path):
    plan = _plan(tmp_path)
    assert "#SBATCH --exclusive\n" in plan.job.text and plan.exclusive
    assert not any("--exclusive" in c.job.text for c in plan.cells)  # cells are steps
    assert plan.record()["exclusive"] is True
    profile = config.load_profile("local", {"output_dir": str(tmp_path / "runs"),
                                            "campaign_exclusive": False})
    shared = campaign.plan(profile, config.load_experiment("smoke"))
    assert "--exclusive" not in shared.job.text and shared.record()["exclusive"] is False
    done = _hpcdp(tmp_path, "compare", "--dry-run", "--set", "cluster.campaign_exclusive=maybe")
    assert done.returncode == 2 and "cluster.campaign_exclusive" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_network_probes_run_first_and_again_last(tmp_path):
    plan = _plan(tmp_path, compare={"repeats": 2, "seed": 4})
    start = sorted(c.key for c in plan.probes)
    assert start == ["baseline-distributed-ps-2n", "baseline-horovod-2n"]
    assert sorted(c.key for c in plan.probes_end) == [k.replace("baseline-", "baseline-end-")
                                                      for k in start]
    for c in plan.probes_end:
        assert c.job.run_dir == plan.folder / "baseline-end" / f"{c.strategy.name}-{c.nodes}n"
        assert "TRAIN_ARGS=(\n    allreduce\n" in c.job.text  # python -m train allreduce
    text = plan.job.text
    last_cell = max(text.index(str(c.job.script_path)) for c in plan.cells)
    assert all(text.index(str(c.job.script_path)) > last_cell for c in plan.probes_end)
    assert all(text.index(str(c.job.script_path)) < text.index(str(plan.cells[0].job.script_path))
               for c in plan.probes)
    record = plan.record()
    assert [b["key"] for b in record["baseline_end"]] == [c.key for c in plan.probes_end]


def test_network_baseline_false_leaves_the_probes_out(tmp_path):
    plan = _plan(tmp_path, compare={"repeats": 1, "seed": 4, "network_baseline": False})
    assert plan.probes == plan.probes_end == [] and len(plan.cells) > 1
    assert "allreduce" not in plan.job.text
    assert plan.record()["baseline"] == plan.record()["baseline_end"] == []


def test_a_failed_cell_is_retried_once_at_the_end_of_its_round(tmp_path):
    """The campaign script itself, run by bash outside Slurm, with each cell's script replaced
    by one that fails on purpose: single-gpu-1n-r1 fails once, distributed-ps-1n-r1 always."""
    plan = _plan(tmp_path, compare={"repeats": 2, "order": "as-listed"},
                 matrix={"strategies": ["single-gpu", "ddp"], "nodes": [1]})
    campaign.write(plan)
    once, always = plan.cells[0].job, plan.cells[1].job
    for c in plan.cells:
        c.job.script_path.write_text(f"echo run >>{c.job.run_dir.parent}/attempts-{c.repeat}\n")
    once.script_path.write_text(
        f"echo run >>{once.run_dir.parent}/attempts-1\n"
        f"[ -e {once.run_dir.parent}/failed-before ] && exit 0\n"
        f"touch {once.run_dir.parent}/failed-before {once.run_dir}/metrics.jsonl; exit 3\n")
    always.script_path.write_text(f"echo run >>{always.run_dir.parent}/attempts-1\nexit 4\n")
    done = subprocess.run(["bash", str(plan.job.script_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "SLURM_JOB_ID": "manual"})
    assert done.returncode == 1
    log = (plan.folder / "slurm-manual.out").read_text()
    lines = (plan.folder / "cells.done").read_text().splitlines()
    assert lines == ["failed single-gpu-1n-r1 3", "failed distributed-ps-1n-r1 4",
                     "cell single-gpu-1n-r1 0", "cell distributed-ps-1n-r1 4",
                     "cell single-gpu-1n-r2 0", "cell distributed-ps-1n-r2 0"], log
    # The retries ran at the end of round 1, before round 2.
    assert log.index("single-gpu-1n-r1: retrying") < log.index("single-gpu-1n-r2: starting")
    assert log.rstrip().endswith("4 cells, 2 retried, 1 failed")
    assert (once.run_dir.parent / "attempts-1").read_text().count("run") == 2
    # The failed attempt is set aside; the retry ran in a fresh folder with the same files.
    aside = once.run_dir.with_name("repeat-1.failed")
    assert (aside / "metrics.jsonl").exists() and not (once.run_dir / "metrics.jsonl").exists()
    assert (once.run_dir / "job.sbatch").read_text() == (aside / "job.sbatch").read_text()
    assert (once.run_dir / "experiment.yaml").exists()
    # Run again (a requeue): nothing reruns, every cell is over.
    again = subprocess.run(["bash", str(plan.job.script_path)], capture_output=True,
                           timeout=120, env={**os.environ, "SLURM_JOB_ID": "manual"})
    log = (plan.folder / "slurm-manual.out").read_text()
    assert log.count("done in an earlier run") == 4 and again.returncode == 1
    assert log.rstrip().endswith("4 cells, 2 retried, 1 failed")  # what failed before, too
    assert (once.run_dir.parent / "attempts-1").read_text().count("run") == 2
    assert len((plan.folder / "cells.done").read_text().splitlines()) == 6


def test_a_campaign_requeued_between_a_failure_and_its_retry_retries_it(tmp_path):
    """cells.done says the first attempt failed: the rerun does not start it over as a first
    attempt, it retries it at the end of its round (in the fresh folder set up for it)."""
    plan = _plan(tmp_path, compare={"repeats": 1, "order": "as-listed"},
                 matrix={"strategies": ["single-gpu", "ddp"], "nodes": [1]})
    campaign.write(plan)
    for c in plan.cells:
        c.job.script_path.write_text(f"echo run >>{c.job.run_dir}/attempts\n")
    (plan.folder / "cells.done").write_text("failed single-gpu-1n-r1 1\n")
    done = subprocess.run(["bash", str(plan.job.script_path)], capture_output=True, timeout=120,
                          env={**os.environ, "SLURM_JOB_ID": "manual"})
    log = (plan.folder / "slurm-manual.out").read_text()
    assert done.returncode == 0, log
    assert "single-gpu-1n-r1: failed in an earlier run of this job" in log
    assert log.index("distributed-ps-1n-r1: starting") < log.index("single-gpu-1n-r1: retrying")
    assert (plan.cells[0].job.run_dir / "attempts").read_text() == "run\n"
    assert not plan.cells[0].job.run_dir.with_name("repeat-1.failed").exists()
    assert log.rstrip().endswith("2 cells, 1 retried, 0 failed")


def test_golden_campaign_script(tmp_path, matches_golden):
    """The whole campaign script of a small matrix, as review sees it."""

    profile = config.load_profile("local", {"python": "/opt/venv/bin/python"})
    exp = config.load_experiment("smoke", {"matrix": {"strategies": ["ddp", "horovod"],
                                                      "nodes": [1, 2]},
                                           "compare": {"repeats": 2, "seed": 1}})
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        text = campaign.plan(profile, exp, output_dir="/runs").job.text
    finally:
        os.chdir(old)
    text = text.replace(str(tmp_path), "/WORKDIR")
    matches_golden(text, Path(__file__).parent.parent / "golden" / "campaign@local.sbatch",
                   "HPCDP_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_campaign.py")


def test_the_campaign_says_how_long_it_takes_and_warns_when_the_limit_cannot_cover_it(tmp_path):
    # issue 19, item 10: 70 cells of 5,000 GPT-2 steps asked for 04:00:00 and said nothing
    mine = tmp_path / "my-cluster.yaml"  # the command: a copy of generic-gpu (no gpu_type)
    mine.write_text((PROJECT_ROOT / "experiments" / "profiles" / "generic-gpu.yaml").read_text())
    args = ("compare", "--experiment", "paper", "--cluster", str(mine), "--dry-run")
    unknown = _hpcdp(tmp_path, *args)
    assert unknown.returncode == 0, unknown.stderr
    assert "no estimate" not in unknown.stderr and "campaign duration: about" in unknown.stderr
    assert "the estimate assumes V100 GPUs, the slowest hpcdp knows (cluster.gpu_type is not " \
           "set); set cluster.gpu_type" in unknown.stderr
    assert "more than cluster.time_limit 04:00:00 with 3 requeues" in unknown.stderr
    a100 = _hpcdp(tmp_path, *args, "--set", "cluster.gpu_type=a100")
    assert a100.returncode == 0, a100.stderr
    assert "from FLOPs at 30% of the peak" in a100.stderr
    assert "hpcdp: warning: the campaign needs about" in a100.stderr
    assert "more than cluster.time_limit 04:00:00 with 3 requeues" in a100.stderr
    assert "assumes" not in a100.stderr
    roomy = _hpcdp(tmp_path, *args, "--set", "cluster.gpu_type=a100",
                   "--set", "cluster.time_limit=2-00:00:00")
    assert "warning" not in roomy.stderr and "campaign duration: about" in roomy.stderr


def test_cells_without_an_estimate_leave_the_others_as_a_lower_bound(tmp_path):
    # issue 19, item 10: one cell without a step time erased the whole estimate
    from hpcdp import estimate

    profile = config.load_profile("generic-gpu", {"output_dir": str(tmp_path / "runs"),
                                                  "gpu_type": "v100"})  # no bf16 peak
    exp = config.load_experiment("paper", {"train": {"amp_dtype": "bf16"}})
    plan = campaign.plan(profile, exp)
    mixed = sum(c.strategy.mixed_precision for c in plan.cells)
    guess = estimate.campaign(plan, profile, plan.experiment)
    fp32_only = campaign.plan(profile, config.load_experiment("paper", {"matrix": {
        "strategies": sorted({c.strategy.name for c in plan.cells
                              if not c.strategy.mixed_precision})}}))
    assert 0 < mixed < len(plan.cells) and guess.seconds is not None
    assert guess.seconds >= estimate.campaign(fp32_only, profile, plan.experiment).seconds > 0
    assert guess.missing == mixed
    said = "\n".join(estimate.lines(plan, profile, plan.experiment))
    assert "campaign duration: at least " in said
    assert f"{mixed} of {len(plan.cells)} cells have no estimate" in said and "(bf16)" in said
    assert "hpcdp: warning: the campaign needs at least" in said  # the bound exceeds it
    cpus = _plan(tmp_path)  # CPU nodes: no GPU to assume, no duration without a peak
    said = estimate.lines(cpus, config.load_profile("local"), cpus.experiment)
    assert said == [f"hpcdp: campaign duration: no estimate for {len(cpus.cells)} of "
                    f"{len(cpus.cells)} cells (no earlier run of them under "
                    f"{cpus.folder.parent}, and CPU nodes (cluster.gpus_per_node 0) have no "
                    "peak hpcdp knows: set HPCDP_PEAK_FLOPS (FLOP/s per rank))"]


@pytest.mark.parametrize("value", ["abc", "2.5", "-1"])
def test_a_max_requeues_that_is_not_a_whole_number_is_a_warning_not_a_traceback(
        tmp_path, monkeypatch, value):
    # issue 19, item 10: int(HPCDP_MAX_REQUEUES) raised; the job scripts take 3 instead
    monkeypatch.setenv("HPCDP_MAX_REQUEUES", value)
    done = _hpcdp(tmp_path, "compare", "--experiment", "paper", "--cluster", "generic-gpu",
                  "--set", "cluster.gpu_type=a100", "--dry-run")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert f"hpcdp: warning: HPCDP_MAX_REQUEUES={value!r} is not a whole number" in done.stderr
    assert "with 3 requeues" in done.stderr
    monkeypatch.setenv("HPCDP_MAX_REQUEUES", "7")
    seven = _hpcdp(tmp_path, "compare", "--experiment", "paper", "--cluster", "generic-gpu",
                   "--set", "cluster.gpu_type=a100", "--dry-run")
    assert "not a whole number" not in seven.stderr
    assert "requeue itself about 4 time(s) to finish (HPCDP_MAX_REQUEUES 7)" in seven.stderr


def test_earlier_runs_of_the_same_cells_give_the_step_time(tmp_path):
    from hpcdp import estimate

    plan = _plan(tmp_path, compare={"repeats": 1}, matrix={"strategies": ["single-gpu"],
                                                          "nodes": [1]})
    exp = plan.experiment
    earlier = plan.folder.parent / "old" / "metrics.jsonl"
    earlier.parent.mkdir(parents=True)
    header = {"kind": "header", "strategy": "single-gpu", "nodes": 1, "world_size": 1,
              "config": {"model": {"preset": exp.model.preset},
                         "train": {"seq_len": exp.train.seq_len,
                                   "micro_batch_size": exp.train.micro_batch_size}}}
    summary = {"kind": "summary", "step_time_s_median": 2.0}
    earlier.write_text(json.dumps(header) + "\n" + json.dumps(summary) + "\n")
    guess = estimate.campaign(plan, config.load_profile("local"), exp)
    assert guess.how == "earlier runs of these cells"
    assert guess.seconds == pytest.approx(exp.train.steps * 2.0 + estimate.START_UP_S)
