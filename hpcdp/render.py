"""Render sbatch scripts from templates/: one base, one launch family per way of starting ranks.

Quoting rules, so that no name or path can inject shell:
- `#SBATCH` lines carry only validated values (names, numbers, times, the profile's own
  extra_sbatch options); no path ever goes through sbatch's directive parser.
- Every value in the script body goes through the `q` filter (shlex.quote).
- The job log path is set in the body (`exec >>"$RUN_DIR/..."`), with `#SBATCH --output=/dev/null`,
  because sbatch's directive parser cannot quote arbitrary paths.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from hpcdp import PROJECT_ROOT, TEMPLATES_DIR, __version__
from hpcdp.config import ClusterProfile, Experiment, as_dict
from hpcdp.errors import UsageError
from hpcdp.strategies import Strategy

# Values that go into #SBATCH lines: Slurm names, lists of names, sizes.
_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._,:+-]+")
# Seconds before the time limit at which Slurm signals the batch shell to checkpoint and requeue.
REQUEUE_SIGNAL_LEAD_S = 120
EXPERIMENT_FILE = "experiment.yaml"


@dataclass(frozen=True)
class RenderedJob:
    """One rendered script and where its files go."""

    strategy: Strategy
    nodes: int
    tasks_per_node: int
    run_dir: Path
    script_path: Path
    experiment_file: Path
    text: str


def job_name(experiment: str, strategy: Strategy, nodes: int) -> str:
    return f"{experiment}-{strategy.name}-{nodes}n"


def run_dir_for(profile: ClusterProfile, experiment: Experiment, strategy: Strategy, nodes: int,
                output_dir: str | None = None) -> Path:
    root = Path(output_dir or profile.output_dir).expanduser()
    return (root / experiment.name / f"{strategy.name}-{nodes}n").absolute()


def _environment() -> jinja2.Environment:
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


def _sbatch_value(value: str, what: str) -> str:
    if not _SBATCH_SAFE.fullmatch(value):
        raise UsageError(
            f"{what} {value!r} may hold only letters, digits and . _ , : + - "
            "(it goes into an #SBATCH line)"
        )
    return value


def sbatch_directives(profile: ClusterProfile, strategy: Strategy, nodes: int,
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
        f"--signal=B:USR2@{REQUEUE_SIGNAL_LEAD_S}",
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
        else:
            lines.append(f"--gpus-per-node={kind}{gpus}")
    lines.extend(_no_newline(opt, "cluster.extra_sbatch entry") for opt in profile.extra_sbatch)
    return lines


def render_job(profile: ClusterProfile, experiment: Experiment, strategy: Strategy, nodes: int,
               *, output_dir: str | None = None, script_path: Path | None = None) -> RenderedJob:
    """Render the script for one (strategy, nodes) cell. Pure: writes nothing."""
    strategy.check_nodes(nodes)
    tasks = strategy.tasks_per_node(profile.devices_per_node())
    run_dir = run_dir_for(profile, experiment, strategy, nodes, output_dir)
    # Each run keeps its own resolved experiment: a later render with other --set values
    # must not change what a queued or requeued job trains.
    experiment_file = run_dir / EXPERIMENT_FILE
    name = job_name(experiment.name, strategy, nodes)
    _no_newline(str(run_dir), "output directory")
    env_vars = dict(profile.env)
    if profile.network_interface:
        # distenv reads HPCDP_NETWORK_INTERFACE; NCCL and Gloo read their own names.
        for key in ("HPCDP_NETWORK_INTERFACE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env_vars.setdefault(key, profile.network_interface)
    context = {
        "version": __version__,
        "experiment": experiment,
        "strategy": strategy,
        "nodes": nodes,
        "tasks_per_node": tasks,
        "world_size": nodes * tasks,
        "directives": sbatch_directives(profile, strategy, nodes, name),
        "profile": profile,
        "modules": profile.modules,
        "setup": profile.setup,
        "env": sorted(env_vars.items()),
        "python": profile.python or sys.executable,
        "workdir": str(Path.cwd()),
        "project_root": str(PROJECT_ROOT),
        "run_dir": str(run_dir),
        "experiment_file": str(experiment_file),
    }
    text = _environment().get_template(strategy.template).render(**context)
    return RenderedJob(
        strategy=strategy,
        nodes=nodes,
        tasks_per_node=tasks,
        run_dir=run_dir,
        script_path=script_path or run_dir / "job.sbatch",
        experiment_file=experiment_file,
        text=text,
    )


def experiment_yaml(experiment: Experiment) -> str:
    header = "# Resolved by hpcdp (overrides applied); the run's script reads this file.\n"
    return header + yaml.safe_dump(as_dict(experiment), sort_keys=False)


def write_jobs(jobs: list[RenderedJob], experiment: Experiment) -> None:
    """Write every script (and the resolved experiment) only after all rendered: nothing
    half-written when one cell fails validation."""
    for job in jobs:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(job.experiment_file, experiment_yaml(experiment))
        job.script_path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(job.script_path, job.text)
        job.script_path.chmod(0o755)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
