"""`hpcdp run`: the same training as a one-node job, as local processes, without Slurm.

For machines where no Slurm cluster is reachable and the local one cannot start (not root,
packages missing): the demo falls back to this and says so. Ranks are started by the launcher
each strategy names in the registry (python, torchrun, horovodrun), on this one machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from hpcdp.errors import UsageError
from hpcdp.render import train_arguments
from hpcdp.strategies import StrategySpec

# horovodrun on one machine: Gloo needs no MPI set-up and no ssh.
HOROVOD_CONTROLLER = "gloo"


def launch_command(strategy: StrategySpec, ranks: int, python: str, train_args: list[str],
                   program: tuple[str, ...] = ("-m", "train")) -> list[str]:
    """The strategy's local launcher starting `ranks` processes of `python PROGRAM ARGS`
    (PROGRAM: `-m module` or a script, as both python and torchrun take it)."""
    train = [python, *program, *train_args]
    if strategy.local_launcher == "python":
        return train
    if strategy.local_launcher == "torchrun":
        # train.torchrun: torchrun ending in one line, not ChildFailedError's traceback
        return [python, "-m", "train.torchrun", "--standalone",
                f"--nproc_per_node={ranks}", *program, *train_args]
    horovodrun = shutil.which("horovodrun") or str(Path(python).parent / "horovodrun")
    if not Path(horovodrun).exists():
        raise UsageError("strategy horovod needs Horovod (horovodrun not found): "
                         "run scripts/install-horovod.sh")
    return [horovodrun, "-np", str(ranks), f"--{HOROVOD_CONTROLLER}", *train]


def run_locally(strategy: StrategySpec, ranks: int, experiment_file: Path, run_dir: Path) -> int:
    """Prepare the data, then train; returns the training command's exit code."""
    python = sys.executable
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks = strategy.tasks_per_node(ranks)
    args = train_arguments(strategy, experiment_file, run_dir, tasks, tasks)
    env = dict(os.environ)  # threads: train/ shares this machine's cores among the ranks
    for key in [k for k in env if k.startswith("SLURM_")]:
        del env[key]  # inside an allocation, srun's variables would describe another world
    print(f"hpcdp: running {strategy.name} as {tasks} local process(es), no Slurm; "
          f"metrics in {run_dir}", flush=True)
    prepare = subprocess.run([python, "-m", "train", "prepare", "--experiment",
                              str(experiment_file)], env=env)
    if prepare.returncode != 0:
        return prepare.returncode
    return _saying_each_error_once(launch_command(strategy, tasks, python, args), env)


def _saying_each_error_once(command: list[str], env: dict) -> int:
    """Run `command`, its stderr passed through except an `error: ...` line already passed: a
    bad setting makes every rank say the same one line, and the user needs it once. Returns the
    exit code."""
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    said = set()
    for line in proc.stderr:
        if line.startswith("error:"):
            if line in said:
                continue
            said.add(line)
        sys.stderr.write(line)
        sys.stderr.flush()
    return proc.wait()
