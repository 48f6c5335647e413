"""Bad input: exit code 2, one line naming the bad value and the valid choices, no traceback,
nothing written. Runs the real `hpcdp` entry point in a subprocess."""

import os
import subprocess
import sys

import pytest

BAD_INPUTS = [
    (["render", "--strategy", "nope"], ["'nope'", "distributed-ps", "horovod-apex"]),
    (["render", "--strategy", "ddp", "--nodes", "0"], ["--nodes 0", "1 or more"]),
    (["render", "--strategy", "single-gpu", "--nodes", "2"],
     ["'single-gpu'", "2", "distributed-ps"]),
    (["render", "--strategy", "single-ps", "--nodes", "4"], ["'single-ps'", "4"]),
    (["render", "--set", "cluster.gpus_per_nod=4"], ["'gpus_per_nod'", "gpus_per_node"]),
    (["render", "--set", "train.step=3"], ["'step'", "steps"]),
    (["render", "--set", "trian.steps=3"], ["'trian'", "train"]),
    (["render", "--set", "train.steps=many"], ["train.steps", "'many'", "int"]),
    (["render", "--set", "train.amp_dtype=fp8"], ["'fp8'", "fp16", "bf16"]),
    (["render", "--set", "cluster.time_limit=forever"], ["'forever'", "HH:MM:SS"]),
    (["render", "--set", "matrix.strategies=[ddp,zero3]"], ["'zero3'", "distributed-ps"]),
    # HSDP shards within a node: the local profile's one CPU rank per node cannot.
    (["render", "--strategy", "hsdp", "--nodes", "2"],
     ["'hsdp'", "2 or more processes per node", "not 1", "cluster.cpu_ranks_per_node"]),
    (["render", "--set", "train.fsdp.reshard_after_forward=sometimes"],
     ["train.fsdp.reshard_after_forward", "'sometimes'", "bool"]),
    (["render", "--set", "train.trackers=[tensorboard,neptune]"],
     ["train.trackers", "'neptune'", "tensorboard, mlflow, wandb"]),
    (["harvest", ".", "--to", "wandb", "out"], ["--to 'wandb'", "tensorboard, mlflow"]),
    # refused before the runs are read and their table printed, not after it
    (["harvest", ".", "--out", "/etc/passwd"], ["--out '/etc/passwd' is a file"]),
    (["forecast", ".", "--out", "/etc/passwd"], ["--out '/etc/passwd' is a file"]),
    (["render", "--set", "cluster.partition=gpu;reboot"], ["'gpu;reboot'", "cluster.partition"]),
    (["render", "--experiment", "/does/not/exist.yaml"],
     ["'/does/not/exist.yaml'", "does not exist"]),
    (["render", "--cluster", "nosuchprofile"], ["'nosuchprofile'", "local", "generic-gpu"]),
    (["render", "--set", "nonsense"], ["'nonsense'", "section.key=value"]),
    (["render", "--nodes", "x"], ["--nodes", "'x'"]),
    (["submit", "--strategy", "horovod", "--nodes", "-1"], ["--nodes -1"]),
    (["frobnicate"], ["frobnicate", "render"]),
    (["status", "--watch", "-1"], ["--watch", "-1", "above 0"]),
    (["status", "--last", "0"], ["--last", "0", "1 or more"]),
    (["run", "--ranks", "0"], ["--ranks", "0", "1 or more"]),
    (["render", "--experiment", "/etc/passwd/x.yaml"], ["'/etc/passwd/x.yaml'", "cannot be read"]),
    # issue 13: a lead before the time limit that is not shorter than the limit
    (["render", "--set", "cluster.time_limit=2", "--set", "cluster.signal_lead_s=120"],
     ["cluster.signal_lead_s 120", "'2' (120 s)"]),
    (["render", "--set", "cluster.time_limit=0"], ["cluster.time_limit '0'", "longer than 0"]),
    # issue 13: an empty matrix is refused, not a silent exit 0
    (["submit", "--set", "matrix.strategies=[single-gpu]", "--set", "matrix.nodes=[2]", "--wait"],
     ["no jobs", "single-gpu runs on 1 node only", "[2]"]),
    (["render", "--set", "matrix.nodes=[]"], ["no jobs", "matrix.nodes is empty"]),
    (["render", "--set", "matrix.strategies=[]"], ["no jobs", "matrix.strategies is empty"]),
    (["run", "--set", "matrix.nodes=[2]"], ["no jobs", "this command runs on 1 node only"]),
    # issue 13: what sbatch would reject later
    (["render", "--set", """cluster.extra_sbatch=['--comment="a b"']"""],
     ["extra_sbatch", "double quote"]),
    (["render", "--set", "cluster.extra_sbatch=['--comment a b']"],
     ["extra_sbatch", "--name=value"]),
    # a corpus that is not there: refused before anything is queued or started, not a FAILED job
    (["submit", "--set", "data.corpus=/no/such/corpus"], ["data.corpus '/no/such/corpus'",
                                                          "shakespeare", "folder of"]),
    (["run", "--set", "data.corpus=shakespear"], ["'shakespear'", "did you mean 'shakespeare'"]),
    (["compare", "--set", "data.corpus=nope.jsonl"], ["data.corpus 'nope.jsonl'"]),
    # sbatch's options typed to hpcdp: where each goes; never an abbreviation (--time is not
    # --timeout, --dry-ru not --dry-run)
    (["submit", "--time", "2:00:00", "--dry-run"],
     ["submit: unrecognized arguments: --time 2:00:00", "--set cluster.time_limit=2:00:00"]),
    (["render", "-p", "gpu"], ["-p is the cluster profile's partition", "cluster.partition=gpu"]),
    (["compare", "--constraint=v100"], ["--set \"cluster.extra_sbatch=['--constraint=v100']\""]),
    (["submit", "--dry-ru"], ["unrecognized arguments: --dry-ru", "`hpcdp submit --help`"]),
    (["harvest", ".", "--partition", "x"],
     ["harvest: unrecognized arguments: --partition x;", "`hpcdp harvest --help`"]),
]


def run_hpcdp(args, cwd):
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("args,expected", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, expected):
    result = run_hpcdp([*args, "--out", str(tmp_path / "runs")] if args[0] in ("render", "submit")
                       else args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("hpcdp: error: ") and not lines[0].startswith(
        "hpcdp: error: hpcdp"), "the CLI's name once"
    for fragment in expected:
        assert fragment in lines[0], (fragment, lines[0])
    assert list(tmp_path.iterdir()) == [], "nothing may be written on bad input"


@pytest.mark.parametrize("content,expected", [
    ("- just\n- a list\n", "must hold a YAML mapping"),
    ("", "it is empty"),
    ("# only a comment\n", "it is empty"),
    ("name: [unclosed\n", "not valid YAML"),
    ("model:\n  preset: gpt5\n", "'gpt5'"),
    ("train:\n  stepz: 3\n", "'stepz'"),
    ("train: 7\n", "train must be a mapping"),
])
def test_bad_experiment_files(tmp_path, content, expected):
    path = tmp_path / "exp.yaml"
    path.write_text(content)
    result = run_hpcdp(["render", "--experiment", str(path), "--out", str(tmp_path / "runs")],
                       cwd=tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert expected in result.stderr
    assert not (tmp_path / "runs").exists()


# Three problems in one experiment file, each of a different kind: a misspelt key, a wrong type,
# a value outside its choices (and one in the profile), all named by one run.
THREE_PROBLEMS = "train:\n  stepz: 3\n  micro_batch_size: x\nmodel:\n  preset: gpt5\n"
THREE_NAMED = ["3 problems: (1) ", "'stepz'", "did you mean 'steps'",
               "(2) train.micro_batch_size 'x'", "(3) model.preset 'gpt5'"]


@pytest.mark.parametrize("command", ["render", "submit", "compare", "run"])
def test_every_problem_of_a_configuration_is_named_in_one_run(tmp_path, command):
    """litgpt's lesson: a file with three mistakes takes one run to fix, not three. Each way in
    that loads a profile and an experiment names the profile's problems and the experiment's
    together, on one line."""
    (tmp_path / "exp.yaml").write_text(THREE_PROBLEMS)
    result = run_hpcdp([command, "--experiment", "exp.yaml"]
                       + (["--out", "runs"] if command in ("render", "submit") else []),
                       cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(f in lines[0] for f in THREE_NAMED), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]

    (tmp_path / "profile.yaml").write_text("partition: debug\ngpus_per_nod: 4\n")
    result = run_hpcdp([command, "--experiment", "exp.yaml", "--cluster", "profile.yaml",
                        "--set", "train.lr=fast"], cwd=tmp_path)
    line = result.stderr.strip()
    assert result.returncode == 2 and "\n" not in line
    assert line.startswith("hpcdp: error: 5 problems: (1) unknown key 'gpus_per_nod' in cluster "
                           "(did you mean 'gpus_per_node'?)"), line
    assert "train.lr 'fast'" in line and "model.preset 'gpt5'" in line


def test_python_m_train_names_every_problem_too(tmp_path):
    (tmp_path / "exp.yaml").write_text(THREE_PROBLEMS)
    result = subprocess.run([sys.executable, "-m", "train", "--experiment", "exp.yaml",
                             "--strategy", "ddp", "--out", "run"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(f in lines[0] for f in THREE_NAMED), lines
    assert not (tmp_path / "run").exists()


def test_a_top_level_typo_names_the_experiment_and_one_problem_reads_as_before(tmp_path):
    (tmp_path / "exp.yaml").write_text("tain:\n  steps: 3\n")
    result = run_hpcdp(["render", "--experiment", "exp.yaml", "--out", "runs"], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "hpcdp: error: unknown key 'tain' in the experiment (did you mean 'train'?); valid keys: "
    ), result.stderr


@pytest.mark.parametrize("name", ["forecast-published", "forecast-published-series"])
def test_the_forecasts_published_figures_are_not_taken_for_an_experiment(tmp_path, name):
    """They live beside the experiments (experiments/), but are the forecast's data: named as
    an experiment they are refused for what they are, and the list of experiments leaves them
    out."""
    result = run_hpcdp(["render", "--experiment", name, "--out", "runs"], cwd=tmp_path)
    assert result.returncode == 2
    assert f"'{name}' is the published" in result.stderr and "not one to run" in result.stderr
    result = run_hpcdp(["render", "--experiment", "nope", "--out", "runs"], cwd=tmp_path)
    assert "shipped: modern, modern-smoke, paper, smoke, or" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_matrix_with_one_bad_cell_writes_nothing(tmp_path):
    # single-gpu on 2 nodes is skipped by the matrix, but a bad profile value fails every cell:
    # validation must finish before the first file is written.
    result = run_hpcdp(["render", "--set", "cluster.extra_sbatch=[--ok, bad]",
                        "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert result.returncode == 2
    assert "'bad'" in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,expected", [
    (["--experiment", "smoke"], ["--strategy", "--out"]),
    (["--experiment", "smoke", "--strategy", "ddp", "--out", "x", "--expect-world", "abc"],
     ["--expect-world", "'abc'"]),
    (["--experiment", "smoke", "--strategy", "zero3", "--out", "x"], ["'zero3'"]),
    (["--experiment", "smoke", "--strategy", "ddp", "--out", "x", "--set", "data.corpus=/no/x"],
     ["data.corpus '/no/x'", "no such file or folder"]),
])
def test_train_entrypoint_errors_are_one_line(tmp_path, args, expected):
    result = subprocess.run([sys.executable, "-m", "train", *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(f in lines[0] for f in expected), result.stderr


def test_bad_peak_flops_is_one_line(tmp_path):
    env = {**__import__("os").environ, "HPCDP_PEAK_FLOPS": "fast"}
    result = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "single-gpu",
         "--out", str(tmp_path / "run"), "--set", "data.corpus=synthetic",
         "--set", "train.steps=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: HPCDP_PEAK_FLOPS='fast'")
    assert "Traceback" not in result.stderr


def test_an_over_long_output_path_is_one_line_and_writes_nothing(tmp_path):
    """OSError: [Errno 36] File name too long used to come out as a traceback."""
    out = tmp_path / "runs" / ("x" * 300)
    result = run_hpcdp(["render", "--strategy", "ddp", "--out", str(out)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "300 bytes" in result.stderr and "255" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["--help"], ["status"], ["cluster", "status"]])
def test_a_reader_that_stops_early_is_no_traceback(tmp_path, args):
    """issue 36, item 7: `hpcdp cluster status | head -12` ended in a BrokenPipeError traceback.
    The pipe's reading end is closed before hpcdp writes, so every write meets a closed pipe."""
    env = {**os.environ, "HPCDP_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen([sys.executable, "-m", "hpcdp", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
