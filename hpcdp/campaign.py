"""`hpcdp compare`: the paper's comparison as one campaign, a single allocation that runs every
(strategy, nodes, repeat) cell one after another, so that every cell sees the same nodes,
network, software and time window, and no two cells overlap.

The campaign script (templates/campaign.sbatch.j2, on the same base as every per-cell script)
runs each cell's own rendered script, the text `hpcdp submit` would send for that cell, with
HPCDP_CAMPAIGN=1: its srun steps then take exactly the cell's nodes and tasks (`--exact`), and
the campaign, not the cell, requeues the job. Finished cells are listed in cells.done, so a
requeued campaign skips them and the interrupted cell resumes from its checkpoint.

Every cell runs under one set of conditions: one allocator (train.malloc, resolved here for the
whole campaign), the CPUs per rank the cell would get as a job of its own, an exclusive
allocation (cluster.campaign_exclusive). Each repeat is one shuffled round of every cell; a cell
that fails is retried once at the end of its round.

Layout of a campaign folder (<output>/<experiment>/compare):

    campaign.sbatch  experiment.yaml  campaign.json  cells.done  slurm-JOB.out
    baseline/<strategy>-<N>n/        the network probes run before the first cell
    baseline-end/<strategy>-<N>n/    the same probes, run after the last cell
    <strategy>-<N>n/repeat-<k>/      one run folder per cell, as `hpcdp submit` makes them
    <strategy>-<N>n/repeat-<k>.failed/   a failed attempt, set aside before its retry
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import render, run_folder
from hpcdp.config import ClusterProfile, Experiment
from hpcdp.errors import UsageError
from hpcdp.render import RenderedJob
from hpcdp.strategies import StrategySpec

CAMPAIGN_FILE = "campaign.json"
SCRIPT_NAME = "campaign.sbatch"
BASELINE_FOLDER = "baseline"
"""The network probes run before the first cell."""
BASELINE_END_FOLDER = "baseline-end"
"""The same probes, run after the last cell: the network's drift over the allocation."""
FAILED_SUFFIX = ".failed"
"""A failed attempt's run folder, set aside before the retry: repeat-<k>.failed."""


@dataclass(frozen=True)
class Cell:
    strategy: StrategySpec
    nodes: int
    repeat: int
    """0 for a network-baseline probe."""
    job: RenderedJob
    at_end: bool = False
    """A probe run after the last cell (baseline-end/)."""

    @property
    def key(self) -> str:
        if self.repeat == 0:
            return f"baseline{'-end' if self.at_end else ''}-{self.strategy.name}-{self.nodes}n"
        return f"{self.strategy.name}-{self.nodes}n-r{self.repeat}"


@dataclass(frozen=True)
class Campaign:
    folder: Path
    cells: list[Cell]
    """In the order the campaign runs them: round after round (one round per repeat)."""
    probes: list[Cell]
    """The network baseline, run before every cell: one all-reduce probe per transport and
    node count of the matrix that communicates."""
    probes_end: list[Cell]
    """The same probes, run after every cell (baseline-end/)."""
    seed: int | None
    job: RenderedJob
    """The campaign script itself (its strategy: the largest cell's, which sizes the job)."""
    experiment: Experiment
    """What every cell trains: the experiment given, with train.malloc resolved once for the
    whole campaign. Write and check this one, not the one given."""
    exclusive: bool
    """Whether the job asks for whole nodes (--exclusive)."""
    notes: list[str] = field(default_factory=list)
    """Lines to tell the user (how the allocator was chosen)."""

    def record(self) -> dict:
        """campaign.json: what ran where, in which order, from which seed, under which
        conditions."""
        exp = self.job.experiment_file
        return {"experiment_file": str(exp), "seed": self.seed,
                "order": self.experiment.compare.order, "nodes": self.job.nodes,
                "tasks_per_node": self.job.tasks_per_node,
                "malloc": self.experiment.train.malloc, "exclusive": self.exclusive,
                "baseline": [_entry(c) for c in self.probes],
                "baseline_end": [_entry(c) for c in self.probes_end],
                "cells": [_entry(c) for c in self.cells]}


def _entry(c: Cell) -> dict:
    return {"key": c.key, "strategy": c.strategy.name, "nodes": c.nodes, "repeat": c.repeat,
            "tasks_per_node": c.job.tasks_per_node, "run_dir": str(c.job.run_dir)}


def campaign_folder(profile: ClusterProfile, experiment: Experiment,
                    output_dir: str | None = None) -> Path:
    root = Path(output_dir or profile.output_dir).expanduser()
    return (root / experiment.name / "compare").absolute()


def recorded_seed(folder: Path) -> int | None:
    """The seed of the campaign already in `folder`, so that continuing it keeps its order."""
    try:
        seed = json.loads((folder / CAMPAIGN_FILE).read_text()).get("seed")
    except (OSError, ValueError, AttributeError):
        return None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def _ordered(cells: list[tuple[StrategySpec, int]], repeats: int, order: str,
             seed: int | None) -> list[tuple[StrategySpec, int, int]]:
    """Blocked: each repeat is one round of every cell, so that drift over the allocation
    reaches every cell alike (a whole-list shuffle could run both repeats of a cell back to
    back). Each round is shuffled on its own when asked, from one seeded generator."""
    rng = random.Random(seed)
    runs = []
    for k in range(1, repeats + 1):
        block = list(cells)
        if order == "shuffled":
            rng.shuffle(block)
        runs.extend((s, n, k) for s, n in block)
    return runs


def _initialise_mpi(profile: ClusterProfile, strategy: StrategySpec) -> bool:
    """Whether the strategy's ranks start Open MPI (Horovod under its MPI controller)."""
    return strategy.needs_horovod and profile.horovod_controller == "mpi"


def campaign_malloc(profile: ClusterProfile, experiment: Experiment,
                    cells: list[tuple[StrategySpec, int]]) -> tuple[str, list[str]]:
    """The one train.malloc every cell of the campaign gets, and the lines that say why.

    `auto` picks per process (train/malloc.py): tcmalloc on CPU hosts, but glibc's malloc in
    ranks that initialise MPI, so a campaign with Horovod-over-MPI cells would compare
    allocators as much as strategies. Then every cell gets `system`. An allocator named
    outright that those cells should not take is refused, naming them."""
    setting = experiment.train.malloc
    mpi = [f"{s.name} {n}n" for s, n in cells if _initialise_mpi(profile, s)]
    if not mpi or setting == "system":
        return setting, []
    names = ", ".join(mpi[:4]) + (f" and {len(mpi) - 4} more" if len(mpi) > 4 else "")
    ways = ("cluster.horovod_controller=gloo (Horovod without MPI), or leave Horovod out of "
            "matrix.strategies")
    if setting == "auto":
        return "system", [
            f"hpcdp: train.malloc auto: every cell runs glibc's malloc (system), as the "
            f"Horovod-over-MPI cells ({names}) must; for tcmalloc in every cell set {ways}"]
    raise UsageError(
        f"train.malloc {setting!r}: the Horovod-over-MPI cells ({names}) keep glibc's malloc "
        "(Open MPI interposes the memory functions; docs/performance.md#the-allocator), so "
        "cells would differ in allocator; choose one for every cell: --set train.malloc=system "
        f"(or auto), or keep {setting} with {ways}")


def _exclusive(profile: ClusterProfile, directives: list[str]) -> list[str]:
    """The campaign's #SBATCH lines with --exclusive (whole nodes: no other job's processes
    beside the cells), unless the profile turns it off (cluster.campaign_exclusive)."""
    if profile.campaign_exclusive and not any(d.split("=")[0] == "--exclusive"
                                              for d in directives):
        return [*directives, "--exclusive"]
    return directives


def plan(profile: ClusterProfile, experiment: Experiment, *, output_dir: str | None = None,
         repeats: int | None = None, fresh: bool = False) -> Campaign:
    """Render every cell and the campaign script. Pure: writes nothing. fresh: a new campaign
    replaces the one in the folder, so its recorded seed is not continued (compare.seed null:
    a new one is drawn)."""
    folder = campaign_folder(profile, experiment, output_dir)
    settings = experiment.compare
    repeats = repeats or settings.repeats
    seed = None
    if settings.order == "shuffled":
        seed = settings.seed if settings.seed is not None or fresh else recorded_seed(folder)
        seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    matrix = experiment.matrix.cells()
    malloc, notes = campaign_malloc(profile, experiment, matrix)
    experiment = dataclasses.replace(
        experiment, train=dataclasses.replace(experiment.train, malloc=malloc))
    cells = []
    for strategy, nodes, repeat in _ordered(matrix, repeats, settings.order, seed):
        run_dir = folder / f"{strategy.name}-{nodes}n" / f"repeat-{repeat}"
        job = render.render_job(profile, experiment, strategy, nodes, run_dir=run_dir)
        cells.append(Cell(strategy, nodes, repeat, job))
    probes, probes_end = [], []
    if settings.network_baseline:
        probes = _probes(profile, experiment, folder, cells, at_end=False)
        probes_end = _probes(profile, experiment, folder, cells, at_end=True)
    job = _campaign_job(profile, experiment, folder, probes, cells, probes_end, repeats, seed)
    exclusive = profile.campaign_exclusive or any(
        opt.split("=")[0] == "--exclusive" for opt in profile.extra_sbatch)
    return Campaign(folder, cells, probes, probes_end, seed, job, experiment, exclusive, notes)


def _probes(profile: ClusterProfile, experiment: Experiment, folder: Path,
            cells: list[Cell], at_end: bool) -> list[Cell]:
    """One all-reduce probe per transport (DDP's, Horovod's) and node count whose cells send
    gradients between more than one rank, run as the transport's first strategy."""
    probes: dict[tuple[str, int], Cell] = {}
    where = folder / (BASELINE_END_FOLDER if at_end else BASELINE_FOLDER)
    for c in sorted(cells, key=lambda c: (c.nodes, c.strategy.name)):
        if not c.strategy.grad_comm or c.nodes * c.job.tasks_per_node < 2:
            continue
        key = (c.strategy.transport, c.nodes)
        if key not in probes:
            run_dir = where / f"{c.strategy.name}-{c.nodes}n"
            job = render.render_job(profile, experiment, c.strategy, c.nodes, run_dir=run_dir,
                                    command="allreduce")
            probes[key] = Cell(c.strategy, c.nodes, 0, job, at_end=at_end)
    return list(probes.values())


def _largest(profile: ClusterProfile, cells: list[Cell]) -> Cell:
    """The cell that sizes the allocation: most nodes, then most GPUs and tasks per node."""
    def size(c: Cell) -> tuple:
        return (c.nodes, c.strategy.gpus_per_node(profile.gpus_per_node) or 0,
                c.job.tasks_per_node)
    return max(cells, key=size)


def _campaign_job(profile: ClusterProfile, experiment: Experiment, folder: Path,
                  probes: list[Cell], cells: list[Cell], probes_end: list[Cell], repeats: int,
                  seed: int | None) -> RenderedJob:
    largest = _largest(profile, cells)
    name = f"{experiment.name}-compare"
    context = render.script_context(profile, experiment, largest.strategy, largest.nodes,
                                    folder, name)
    # Round 0: the start probes; 1..repeats: one round of every cell each (a failed cell is
    # retried at the end of its round); repeats + 1: the end probes.
    rounds = [(0, c) for c in probes] + [(c.repeat, c) for c in cells] + \
        [(repeats + 1, c) for c in probes_end]
    context.update(
        directives=_exclusive(profile, context["directives"]),
        cells=[{"key": c.key, "tasks_per_node": c.job.tasks_per_node,
                "world_size": c.nodes * c.job.tasks_per_node, "round": r,
                "script": str(c.job.script_path)} for r, c in rounds],
        repeats=repeats, order=experiment.compare.order, seed=seed, probes=len(probes),
        probes_end=len(probes_end), malloc=experiment.train.malloc,
        experiment_name=run_folder.EXPERIMENT_FILE, failed_suffix=FAILED_SUFFIX)
    text = render.render_template("campaign.sbatch.j2", context)
    return RenderedJob(strategy=largest.strategy, nodes=largest.nodes,
                       tasks_per_node=largest.job.tasks_per_node, run_dir=folder,
                       script_path=folder / SCRIPT_NAME,
                       experiment_file=folder / run_folder.EXPERIMENT_FILE, text=text)


def write(campaign: Campaign) -> dict:
    """Every cell's files, the campaign script and campaign.json; all or nothing. Returns the
    take-back functions of render.write_jobs."""
    jobs = [c.job for c in campaign.probes + campaign.cells + campaign.probes_end]
    undo = render.write_jobs(jobs + [campaign.job], campaign.experiment)
    path = campaign.folder / CAMPAIGN_FILE
    render.write_whole(path, json.dumps(campaign.record(), indent=2) + "\n")
    return undo
