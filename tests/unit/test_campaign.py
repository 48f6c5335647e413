"""hpcdp compare's plan and script, without Slurm: the order, its seed, the allocation's size,
the cells' own scripts, shell syntax, and that a dry run writes nothing."""

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
    assert "HPCDP_CAMPAIGN=1 bash \"$script\"" in text and "seed 11" in text
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
    assert done.stdout.count("/job.sbatch") == len(plan.cells) + len(plan.probes)
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
])
def test_bad_compare_input_is_one_line_exit_2(tmp_path, args, needle):
    done = _hpcdp(tmp_path, "compare", "--dry-run", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and list(tmp_path.iterdir()) == []
