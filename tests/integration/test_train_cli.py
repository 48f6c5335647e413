"""`python -m train` as the rendered scripts call it: fast help, one-line errors with exit 2,
fail-fast world checks, and clear messages when Horovod or apex are missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_port import free_port

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra})
    return env


def train(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", *args], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=240)


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_help_imports_neither_torch_nor_transformers() -> None:
    probe = ("import sys, runpy\n"
             "sys.argv = ['train', '--help']\n"
             "try:\n    runpy.run_module('train', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'numpy') "
             "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "prepare" in done.stdout and "run" in done.stdout
    assert "HEAVY []" in done.stdout


@pytest.mark.parametrize("argv,says", [
    (["export", "/nonexistent/run", "--to", "OUT"], "is not a folder"),
    (["export", "RUN", "--to", "OUT", "--dtype", "fp8"], "--dtype 'fp8'"),
    (["export", "RUN", "--to", "OUT"], "no checkpoint in"),
    (["export", "RUN", "--to", "FILE/out"], "'FILE' is not a folder you can write to"),
    (["export", "RUN", "--to", "FILE", "--force"], "--to 'FILE' is a file"),
    (["eval", "RUN"], "no checkpoint in"),
    (["sample", "RUN", "--prompt", "hi"], "holds no config.json")])
def test_model_commands_refuse_bad_input_before_importing_torch(argv, says, tmp_path) -> None:
    """A typo costs 0.3 s, not the 5 s of torch and transformers (train/export.py)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "a-file").write_text("")
    names = {"RUN": tmp_path / "run", "OUT": tmp_path / "out", "FILE": tmp_path / "a-file"}
    def placed(arg: str) -> str:  # RUN, OUT and FILE, alone or as a path's first part
        head, sep, rest = arg.partition("/")
        return f"{names[head]}{sep}{rest}" if head in names else arg

    argv = [placed(a) for a in argv]
    says = says.replace("FILE", str(names["FILE"]))
    done = main_reporting_heavy_imports(argv)
    one_line_error(done, says)
    assert "HEAVY []" in done.stdout, done.stdout


def main_reporting_heavy_imports(argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m train ARGV`, which then prints "HEAVY [...]": which of torch and transformers
    it had imported when it returned."""
    probe = "\n".join([
        "import sys", "from train.__main__ import main", f"code = main({argv!r})",
        "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))",
        "sys.exit(code)"])
    return subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=60)


def test_run_help_lists_the_flags_the_scripts_use() -> None:
    done = train("run", "--help")
    assert done.returncode == 0
    for flag in ("--experiment", "--strategy", "--out", "--set", "--resume", "--expect-world",
                 "--expect-tasks-per-node"):
        assert flag in done.stdout


@pytest.mark.parametrize(("args", "needles"), [
    (["--strategy", "hovorod"], ["'hovorod'", "did you mean 'horovod'"]),
    (["--strategy", "ddp", "--set", "train.stepz=3"], ["'stepz'", "steps"]),
    (["--strategy", "ddp", "--set", "train.steps=0"], ["train.steps"]),
    (["--strategy", "ddp", "--expect-world", "0"], ["--expect-world", "0 must be 1 or more"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                          needles: list[str]) -> None:
    done = train("--experiment", "smoke", "--out", str(tmp_path), *args)
    one_line_error(done, *needles)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_world_the_launcher_did_not_start_fails_fast(tmp_path: Path) -> None:
    """What a script sees when srun started 1 task where the strategy wants 4: refused before
    torch loads (every rank of a wrong launch would spend 5 s on it)."""
    common = ["--experiment", "smoke", "--strategy", "ddp", "--out", str(tmp_path),
              "--set", "data.corpus=synthetic"]
    done = main_reporting_heavy_imports([*common, "--expect-world", "4"])
    one_line_error(done, "started with 1 process", "asked for 4")
    assert "HEAVY []" in done.stdout, done.stdout
    done = main_reporting_heavy_imports([*common, "--expect-tasks-per-node", "2"])
    one_line_error(done, "asked for 2 per node")
    assert "HEAVY []" in done.stdout, done.stdout
    assert not (tmp_path / "metrics.jsonl").exists()


def test_unprepared_data_says_how_to_prepare(tmp_path: Path) -> None:
    done = train("--experiment", "smoke", "--strategy", "single-gpu", "--out",
                 str(tmp_path / "run"), "--set", f"data.prepared_dir={tmp_path / 'none'}")
    one_line_error(done, "python -m train prepare --experiment smoke")


def test_prepare_then_train_on_the_prepared_text(tmp_path: Path) -> None:
    setting = f"data.prepared_dir={tmp_path / 'prepared'}"
    done = train("prepare", "--experiment", "smoke", "--set", setting)
    assert done.returncode == 0, done.stderr
    done = train("--experiment", "smoke", "--strategy", "single-gpu", "--out",
                 str(tmp_path / "run"), "--set", setting, "--set", "train.steps=2")
    assert done.returncode == 0, done.stderr
    assert "step 2/2 | loss" in done.stdout


def test_missing_horovod_names_the_install_script(tmp_path: Path) -> None:
    # Horovod may well be installed in this venv: a `horovod` package that fails to import,
    # first on the path, is what a venv without it looks like to `import horovod.torch`.
    fake = tmp_path / "fake" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named horovod')\n")
    done = subprocess.run(
        [sys.executable, "-m", "train", "--experiment", "smoke", "--strategy", "horovod",
         "--out", str(tmp_path / "run"), "--set", "data.corpus=synthetic"],
        cwd=ROOT, env=_env(PYTHONPATH=f"{tmp_path / 'fake'}{os.pathsep}{ROOT}"),
        capture_output=True, text=True, timeout=240)
    one_line_error(done, "horovod is not installed: run scripts/install-horovod.sh")


def test_legacy_apex_on_cpu_says_native_amp_is_the_default(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("GPUs visible: apex.amp may be usable here")
    done = train("--experiment", "smoke", "--strategy", "distributed-ps-apex", "--out",
                 str(tmp_path), "--set", "data.corpus=synthetic", "--set",
                 "train.amp_backend=apex", MASTER_PORT=str(free_port()))
    one_line_error(done, "apex", "native")
    # A plain strategy in a matrix whose mixed-precision back-end is apex trains in fp32.
    done = train("--experiment", "smoke", "--strategy", "single-gpu", "--out", str(tmp_path),
                 "--set", "data.corpus=synthetic", "--set", "train.amp_backend=apex",
                 "--set", "train.steps=2")
    assert done.returncode == 0, done.stderr
    header = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert header["precision"] == "fp32"


@pytest.mark.parametrize("setting", ["tcmalloc", "system", "auto"])
def test_training_runs_with_the_allocator_train_malloc_names(tmp_path, setting) -> None:
    """The process re-executes itself with the library preloaded; the header says what it ran
    with, read from its own mapped libraries. scripts/setup.sh installs tcmalloc."""
    from train import malloc

    out = tmp_path / "run"
    done = train("--experiment", "smoke", "--strategy", "single-gpu", "--out", str(out),
                 "--set", "train.steps=2", "--set", "train.eval_batches=1",
                 "--set", f"train.malloc={setting}")
    assert done.returncode == 0, done.stderr
    header = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert header["malloc"] == malloc.choose(setting)[0]
    assert header["config"]["train"]["malloc"] == setting


def test_a_folder_that_holds_a_run_is_not_started_over_without_resume(tmp_path: Path) -> None:
    """`python -m train` by hand, twice into one --out, used to start over silently: the second
    run's records went into the first's metrics.jsonl (read back as one run resumed) beside the
    first's checkpoints. Now every rank refuses without --resume, before anything is written;
    --resume continues it. (hpcdp's commands and rendered scripts always pass --resume.)"""
    out = tmp_path / "run"
    fast = ["--experiment", "smoke", "--out", str(out), "--set", "train.eval_interval=0",
            "--set", "data.corpus=synthetic"]
    done = train("--strategy", "single-gpu", "--set", "train.steps=2", *fast)
    assert done.returncode == 0, done.stderr
    before = (out / "metrics.jsonl").read_bytes()
    for strategy in ("single-gpu", "fsdp"):  # the same strategy or another: both refused
        done = train("--strategy", strategy, "--set", "train.steps=3", *fast)
        one_line_error(done, f"{out} holds an earlier run", "add --resume")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "train",
           "--strategy", "ddp", "--set", "train.steps=3", *fast]
    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert said == [said[0]] and "holds an earlier run" in said[0], done.stderr[-2000:]
    assert (out / "metrics.jsonl").read_bytes() == before
    done = train("--strategy", "single-gpu", "--set", "train.steps=3", "--resume", *fast)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout + done.stderr and "step 3/3" in done.stdout
