"""Render sbatch scripts from templates/: one base, one launch family per way of starting ranks.

Quoting rules, so that no name or path can inject shell:
- `#SBATCH` lines carry only validated values (names, numbers, times, the profile's own
  extra_sbatch options); no path ever goes through sbatch's directive parser.
- Every value in the script body goes through the `q` filter (shlex.quote).
- The job log path is set in the body (`exec >>"$RUN_DIR/..."`), with `#SBATCH --output=/dev/null`,
  because sbatch's directive parser cannot quote arbitrary paths.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from hpcdp import (
    PROJECT_ROOT,
    TEMPLATES_DIR,
    __version__,
    containers,
    distenv,
    shared_fs,
    slurm,
    strategies,
)
from hpcdp.config import ClusterProfile, Experiment, as_dict
from hpcdp.errors import UsageError
from hpcdp.run_folder import EXPERIMENT_FILE
from hpcdp.strategies import StrategySpec

# Values that go into #SBATCH lines: Slurm names, lists of names, sizes.
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._,:+-]+")


@dataclass(frozen=True)
class RenderedJob:
    """One rendered script and where its files go."""

    strategy: StrategySpec
    nodes: int
    tasks_per_node: int
    run_dir: Path
    script_path: Path
    experiment_file: Path
    text: str


def job_name(experiment: str, strategy: StrategySpec, nodes: int) -> str:
    return f"{experiment}-{strategy.name}-{nodes}n"


def train_arguments(strategy: StrategySpec, experiment_file: Path, run_dir: Path,
                    world_size: int, tasks_per_node: int, command: str = "run") -> list[str]:
    """`python -m train` arguments of a job: the same for the rendered script and `hpcdp run`.
    Always --resume: a requeued or rerun job continues from its newest checkpoint."""
    return [*([] if command == "run" else [command]), "--experiment", str(experiment_file),
            "--strategy", strategy.name, "--out", str(run_dir), "--resume",
            "--expect-world", str(world_size), "--expect-tasks-per-node", str(tasks_per_node)]


def _option_lines(words: list[str]) -> list[str]:
    """Quoted words, one option and its value per line (for a readable bash array)."""
    lines: list[str] = []
    for word in words:
        if word.startswith("--") or not lines:
            lines.append(shlex.quote(word))
        else:
            lines[-1] += " " + shlex.quote(word)
    return lines


def run_dir_for(profile: ClusterProfile, experiment: Experiment, strategy: StrategySpec, nodes: int,
                output_dir: str | None = None) -> Path:
    root = Path(output_dir or profile.output_dir).expanduser()
    return (root / experiment.name / f"{strategy.name}-{nodes}n").absolute()


@functools.cache
def _environment() -> jinja2.Environment:
    """One per process: jinja2 caches each compiled template in its environment, and compiling
    is most of a render, so a campaign of many scripts would otherwise compile the same
    templates again for each (docs/performance.md, bench/render_cache.py)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def _no_newline(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        raise UsageError(f"{what} {value!r} contains a newline; Slurm cannot take it")
    return value


# Longest file name and path most Linux file systems take (NAME_MAX, PATH_MAX - 1).
_NAME_MAX, _PATH_MAX = 255, 4095


def _check_path(path: Path, what: str) -> None:
    """Refuse a path the file system would reject, before anything is written."""
    for part in path.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise UsageError(f"{what} has a component of {len(os.fsencode(part))} bytes "
                             f"({part[:24]}...); file systems allow {_NAME_MAX}")
    if len(os.fsencode(str(path))) > _PATH_MAX:
        raise UsageError(f"{what} is {len(os.fsencode(str(path)))} bytes long; "
                         f"paths are limited to {_PATH_MAX}")


def extra_sbatch_line(option: str) -> str:
    """One cluster.extra_sbatch entry as an #SBATCH line. sbatch splits these lines at
    whitespace but keeps a double-quoted value whole, so a value with spaces is quoted."""
    name, eq, value = option.partition("=")
    if not eq or not any(c.isspace() for c in value):
        return option
    return f'{name}="{value}"'


def _sbatch_value(value: str, what: str) -> str:
    if not _SBATCH_SAFE.fullmatch(value):
        raise UsageError(
            f"{what} {value!r} may hold only letters, digits and . _ , : + - "
            "(it goes into an #SBATCH line)"
        )
    return value


def sbatch_directives(profile: ClusterProfile, strategy: StrategySpec, nodes: int,
                      name: str) -> list[str]:
    """The #SBATCH options, one per line, in a fixed order."""
    tasks = strategy.tasks_per_node(profile.devices_per_node())
    lines = [
        f"--job-name={_sbatch_value(name, 'job name')}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks}",
        "--output=/dev/null",  # the body redirects to RUN_DIR; see the module docstring
        f"--time={_sbatch_value(profile.time_limit, 'cluster.time_limit')}",
        "--requeue",
        # Slurm signals the batch shell this long before the limit: checkpoint, requeue.
        f"--signal=B:USR2@{profile.signal_lead()}",
    ]
    for key in ("partition", "account", "qos"):
        value = getattr(profile, key)
        if value:
            lines.append(f"--{key}={_sbatch_value(value, f'cluster.{key}')}")
    if profile.cpus_per_task:
        lines.append(f"--cpus-per-task={profile.cpus_per_task}")
    if profile.mem:
        lines.append(f"--mem={_sbatch_value(profile.mem, 'cluster.mem')}")
    gpus = strategy.gpus_per_node(profile.gpus_per_node)
    if gpus:
        kind = f"{_sbatch_value(profile.gpu_type, 'cluster.gpu_type')}:" if profile.gpu_type else ""
        if profile.gpu_request == "gres":
            lines.append(f"--gres=gpu:{kind}{gpus}")
        elif profile.gpu_request == "gpus-per-task":  # DataParallel's one task takes them all
            lines.append(f"--gpus-per-task={kind}{max(1, gpus // tasks)}")
        else:
            lines.append(f"--gpus-per-node={kind}{gpus}")
        if profile.gpu_bind:
            lines.append(f"--gpu-bind={_sbatch_value(profile.gpu_bind, 'cluster.gpu_bind')}")
    lines.extend(extra_sbatch_line(opt) for opt in profile.extra_sbatch)
    return lines


def script_context(profile: ClusterProfile, experiment: Experiment, strategy: StrategySpec,
                   nodes: int, run_dir: Path, name: str) -> dict:
    """What base.sbatch.j2 reads: the job's size and directives (from `strategy` on `nodes`),
    the profile's environment, and where the run's files go."""
    tasks = strategy.tasks_per_node(profile.devices_per_node())
    # The profile's own env wins over what hpcdp derives from network_interface.
    env_vars = distenv.network_env(profile.network_interface) | dict(profile.env)
    container = containers.launch(profile, experiment, run_dir, Path.cwd())
    in_srun = '"${CONTAINER_SRUN[@]}" ' if container and container.srun_words else ""
    in_exec = '"${CONTAINER_EXEC[@]}" ' if container and container.exec_words else ""
    return {
        "version": __version__,
        "experiment": experiment,
        "strategy": strategy,
        "nodes": nodes,
        "tasks_per_node": tasks,
        "world_size": nodes * tasks,
        "directives": sbatch_directives(profile, strategy, nodes, name),
        # One torchrun per node starts the node's ranks: torch.distributed strategies only
        # (Horovod needs srun's MPI).
        "torchrun_per_node": profile.launcher == "torchrun" and strategy.transport == "torch",
        "profile": profile,
        "modules": profile.modules,
        "setup": profile.setup,
        "env": sorted(env_vars.items()),
        "python": profile.python or ("python" if container else sys.executable),
        "container": container,
        # Put on every srun line that starts Python: `srun {in_srun}... {in_exec}"$PYTHON"`.
        "in_srun": in_srun,
        "in_exec": in_exec,
        # The batch step's own Python (data preparation) runs in the container as a step.
        "prepare_launch": ('srun --nodes=1 --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" '
                           + in_srun + in_exec if container else ""),
        # distenv.master_port_for_job in the shell (a batch job's id is a plain number), so
        # that the batch step needs no Python of its own.
        "not_visible_exit": shared_fs.NOT_VISIBLE_EXIT,
        "port_start": distenv.PORT_RANGE_START,
        "port_span": distenv.PORT_RANGE_END - distenv.PORT_RANGE_START + 1,
        "workdir": str(Path.cwd()),
        "project_root": str(PROJECT_ROOT),
        "run_dir": str(run_dir),
        "experiment_file": str(run_dir / EXPERIMENT_FILE),
        # Expanded by the shell in the job: slurm-<job id>.out
        "job_log": slurm.job_log_name("${SLURM_JOB_ID:-manual}"),
    }


def render_template(template: str, context: dict) -> str:
    return _environment().get_template(template).render(**context)


def _check_global_batch(profile: ClusterProfile, experiment: Experiment, strategy: StrategySpec,
                        nodes: int) -> None:
    """Strong scaling: refuse a cell whose replicas do not divide the global batch, before
    anything is written, naming the node counts that would."""
    cfg = experiment.train
    per_node = strategy.replicas_per_node(profile.gpus_per_node, profile.devices_per_node())
    try:
        cfg.accum_steps(nodes * per_node)
    except UsageError as exc:
        fits = [n for n in range(1, max(16, nodes) + 1)
                if cfg.global_batch_size % (cfg.micro_batch_size * n * per_node) == 0
                and (strategy.max_nodes is None or n <= strategy.max_nodes)]
        raise UsageError(f"{strategy.name} on {nodes} node(s): {exc}; node counts that work: "
                         f"{', '.join(map(str, fits)) or 'none'}") from None


def render_job(profile: ClusterProfile, experiment: Experiment, strategy: StrategySpec, nodes: int,
               *, output_dir: str | None = None, script_path: Path | None = None,
               run_dir: Path | None = None, command: str = "run") -> RenderedJob:
    """Render the script for one (strategy, nodes) cell. Pure: writes nothing.
    run_dir: the cell's folder, where not the default under output_dir (a campaign's).
    command: what `python -m train` does (run; allreduce: a campaign's network baseline)."""
    tasks = strategy.tasks_per_node(profile.devices_per_node())
    strategy.check_nodes(nodes)
    strategy.check_tasks_per_node(tasks)
    strategy.check_grad_comm(experiment.train.grad_comm)
    _check_global_batch(profile, experiment, strategy, nodes)
    run_dir = run_dir or run_dir_for(profile, experiment, strategy, nodes, output_dir)
    # Each run keeps its own resolved experiment: a later render with other --set values
    # must not change what a queued or requeued job trains.
    experiment_file = run_dir / EXPERIMENT_FILE
    name = job_name(experiment.name, strategy, nodes)
    _no_newline(str(run_dir), "output directory")
    _check_path(run_dir / ".submitit" / f".{EXPERIMENT_FILE}.tmp", "output directory")
    if script_path is not None:
        _check_path(script_path, "script path")
    context = script_context(profile, experiment, strategy, nodes, run_dir, name)
    context["train_options"] = _option_lines(
        train_arguments(strategy, experiment_file, run_dir, nodes * tasks, tasks, command))
    text = render_template(strategy.template, context)
    return RenderedJob(
        strategy=strategy,
        nodes=nodes,
        tasks_per_node=tasks,
        run_dir=run_dir,
        script_path=script_path or run_dir / "job.sbatch",
        experiment_file=experiment_file,
        text=text,
    )


PREPARE_FOLDER = "prepare"


def render_prepare_job(profile: ClusterProfile, experiment: Experiment, *,
                       output_dir: str | None = None) -> RenderedJob:
    """The job that tokenizes a matrix's data once (templates/prepare.sbatch.j2), in
    <output>/<experiment>/prepare/: one task with the CPUs of a node's ranks, no GPU, no
    requeue. Pure: writes nothing."""
    single = strategies.get("single-gpu")  # one task on one node: the smallest cell's shape
    root = Path(output_dir or profile.output_dir).expanduser()
    run_dir = (root / experiment.name / PREPARE_FOLDER).absolute()
    _no_newline(str(run_dir), "output directory")
    name = f"{experiment.name}-prepare"
    cpus = (profile.cpus_per_task or 1) * profile.devices_per_node()
    directives = [line for line in sbatch_directives(profile, single, 1, name)
                  if not line.startswith(("--gpus", "--gres", "--gpu-bind", "--cpus-per-task",
                                          "--requeue", "--signal"))]
    context = script_context(profile, experiment, single, 1, run_dir, name)
    context.update(directives=[*directives, f"--cpus-per-task={cpus}"], train_options=[])
    return RenderedJob(strategy=single, nodes=1, tasks_per_node=1, run_dir=run_dir,
                       script_path=run_dir / "job.sbatch",
                       experiment_file=run_dir / EXPERIMENT_FILE,
                       text=render_template("prepare.sbatch.j2", context))


def experiment_yaml(experiment: Experiment) -> str:
    header = "# Resolved by hpcdp (overrides applied); the run's script reads this file.\n"
    return header + yaml.safe_dump(as_dict(experiment), sort_keys=False)


def write_jobs(jobs: list[RenderedJob], experiment: Experiment) -> dict[Path, Callable[[], None]]:
    """Write every script (and the resolved experiment) only after all rendered: nothing
    half-written when one cell fails validation.

    Returns, per run directory, a function that takes that job's files back (restores what was
    there before, removes the folders it made), so that a refused submission leaves nothing.
    """
    undo: dict[Path, Callable[[], None]] = {}
    try:
        for job in jobs:
            undo[job.run_dir] = _write_job(job, experiment_yaml(experiment))
    except OSError as exc:
        for take_back in undo.values():
            take_back()
        raise UsageError(f"cannot write {exc.filename or 'the run files'}: "
                         f"{exc.strerror or exc}") from None
    return undo


def _write_job(job: RenderedJob, experiment_text: str) -> Callable[[], None]:
    made: list[Path] = []
    before: list[tuple[Path, str | None]] = []

    def take_back() -> None:
        for path, text in reversed(before):
            if text is None:
                path.unlink(missing_ok=True)
            else:
                write_whole(path, text)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: never anything we did not make

    try:
        for folder in (job.run_dir, job.script_path.parent):
            made.extend(_make_dirs(folder))
        for path, text in ((job.experiment_file, experiment_text), (job.script_path, job.text)):
            before.append((path, path.read_text() if path.exists() else None))
            write_whole(path, text)
        job.script_path.chmod(0o755)
    except OSError:
        take_back()
        raise
    return take_back


def _make_dirs(folder: Path) -> list[Path]:
    """mkdir -p; returns the folders it created, outermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
    return list(reversed(missing))


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all (a temporary beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
