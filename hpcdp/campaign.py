"""`hpcdp compare`: the paper's comparison as one campaign, a single allocation that runs every
(strategy, nodes, repeat) cell one after another, so that every cell sees the same nodes,
network, software and time window, and no two cells overlap.

The campaign script (templates/campaign.sbatch.j2, on the same base as every per-cell script)
runs each cell's own rendered script, the text `hpcdp submit` would send for that cell, with
HPCDP_CAMPAIGN=1: its srun steps then take exactly the cell's nodes and tasks (`--exact`), and
the campaign, not the cell, requeues the job. Finished cells are listed in cells.done, so a
requeued campaign skips them and the interrupted cell resumes from its checkpoint.

Layout of a campaign folder (<output>/<experiment>/compare):

    campaign.sbatch  experiment.yaml  campaign.json  cells.done  slurm-JOB.out
    <strategy>-<N>n/repeat-<k>/      one run folder per cell, as `hpcdp submit` makes them
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from hpcdp import render
from hpcdp.config import ClusterProfile, Experiment
from hpcdp.render import RenderedJob
from hpcdp.strategies import StrategySpec

CAMPAIGN_FILE = "campaign.json"
SCRIPT_NAME = "campaign.sbatch"


@dataclass(frozen=True)
class Cell:
    strategy: StrategySpec
    nodes: int
    repeat: int
    """0 for a network-baseline probe."""
    job: RenderedJob

    @property
    def key(self) -> str:
        if self.repeat == 0:
            return f"baseline-{self.strategy.name}-{self.nodes}n"
        return f"{self.strategy.name}-{self.nodes}n-r{self.repeat}"


@dataclass(frozen=True)
class Campaign:
    folder: Path
    cells: list[Cell]
    """In the order the campaign runs them."""
    probes: list[Cell]
    """The network baseline, run before every cell: one all-reduce probe per transport and
    node count of the matrix that communicates."""
    seed: int | None
    job: RenderedJob
    """The campaign script itself (its strategy: the largest cell's, which sizes the job)."""

    def record(self) -> dict:
        """campaign.json: what ran where, in which order, from which seed."""
        exp = self.job.experiment_file
        return {"experiment_file": str(exp), "seed": self.seed, "nodes": self.job.nodes,
                "tasks_per_node": self.job.tasks_per_node,
                "baseline": [_entry(c) for c in self.probes],
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
    """Repeat by repeat in the matrix's order; shuffled as a whole when asked."""
    runs = [(s, n, k) for k in range(1, repeats + 1) for s, n in cells]
    if order == "shuffled":
        random.Random(seed).shuffle(runs)
    return runs


def plan(profile: ClusterProfile, experiment: Experiment, *, output_dir: str | None = None,
         repeats: int | None = None) -> Campaign:
    """Render every cell and the campaign script. Pure: writes nothing."""
    folder = campaign_folder(profile, experiment, output_dir)
    settings = experiment.compare
    repeats = repeats or settings.repeats
    seed = None
    if settings.order == "shuffled":
        seed = settings.seed if settings.seed is not None else recorded_seed(folder)
        seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    cells = []
    for strategy, nodes, repeat in _ordered(experiment.matrix.cells(), repeats, settings.order,
                                            seed):
        run_dir = folder / f"{strategy.name}-{nodes}n" / f"repeat-{repeat}"
        job = render.render_job(profile, experiment, strategy, nodes, run_dir=run_dir)
        cells.append(Cell(strategy, nodes, repeat, job))
    probes = _probes(profile, experiment, folder, cells)
    job = _campaign_job(profile, experiment, folder, probes, cells, repeats, seed)
    return Campaign(folder, cells, probes, seed, job)


def _probes(profile: ClusterProfile, experiment: Experiment, folder: Path,
            cells: list[Cell]) -> list[Cell]:
    """One all-reduce probe per transport (DDP's, Horovod's) and node count whose cells send
    gradients between more than one rank, run as the transport's first strategy."""
    probes: dict[tuple[str, int], Cell] = {}
    for c in sorted(cells, key=lambda c: (c.nodes, c.strategy.name)):
        if not c.strategy.grad_comm or c.nodes * c.job.tasks_per_node < 2:
            continue
        key = (c.strategy.mechanism, c.nodes)
        if key not in probes:
            run_dir = folder / "baseline" / f"{c.strategy.name}-{c.nodes}n"
            job = render.render_job(profile, experiment, c.strategy, c.nodes, run_dir=run_dir,
                                    command="allreduce")
            probes[key] = Cell(c.strategy, c.nodes, 0, job)
    return list(probes.values())


def _largest(profile: ClusterProfile, cells: list[Cell]) -> Cell:
    """The cell that sizes the allocation: most nodes, then most GPUs and tasks per node."""
    def size(c: Cell) -> tuple:
        return (c.nodes, c.strategy.gpus_per_node(profile.gpus_per_node) or 0,
                c.job.tasks_per_node)
    return max(cells, key=size)


def _campaign_job(profile: ClusterProfile, experiment: Experiment, folder: Path,
                  probes: list[Cell], cells: list[Cell], repeats: int,
                  seed: int | None) -> RenderedJob:
    largest = _largest(profile, cells)
    cells = probes + cells
    name = f"{experiment.name}-compare"
    context = render.script_context(profile, experiment, largest.strategy, largest.nodes,
                                    folder, name)
    context.update(
        cells=[{"key": c.key, "tasks_per_node": c.job.tasks_per_node,
                "world_size": c.nodes * c.job.tasks_per_node,
                "script": str(c.job.script_path)} for c in cells],
        repeats=repeats, order=experiment.compare.order, seed=seed, probes=len(probes))
    text = render.render_template("campaign.sbatch.j2", context)
    return RenderedJob(strategy=largest.strategy, nodes=largest.nodes,
                       tasks_per_node=largest.job.tasks_per_node, run_dir=folder,
                       script_path=folder / SCRIPT_NAME,
                       experiment_file=folder / render.EXPERIMENT_FILE, text=text)


def move_aside(folder: Path) -> None:
    """--fresh: an earlier campaign in `folder` (cells and all) becomes compare.old-TIMESTAMP."""
    import sys
    import time

    if folder.exists() and any(folder.iterdir()):
        target = folder.with_name(f"{folder.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
        folder.rename(target)
        print(f"hpcdp: moved the earlier campaign aside: {target}", file=sys.stderr)


def write(campaign: Campaign, experiment: Experiment) -> dict:
    """Every cell's files, the campaign script and campaign.json; all or nothing. Returns the
    take-back functions of render.write_jobs."""
    undo = render.write_jobs([c.job for c in campaign.probes + campaign.cells] + [campaign.job],
                             experiment)
    path = campaign.folder / CAMPAIGN_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(campaign.record(), indent=2) + "\n")
    tmp.replace(path)
    return undo
