"""How long a campaign will take, said before it is submitted, against the time it may take.

A campaign runs every cell one after another, so its time limit must cover the sum of them (or
the requeues must: near the limit the campaign checkpoints and requeues itself, at most
HPCDP_MAX_REQUEUES times). Each cell's step time comes, in this order, from:

- an earlier run of the same cell (strategy, nodes, ranks, model, sequence length, micro batch)
  under the experiment's output folder: the median step time its summary recorded;
- the model's training FLOPs per step (6N + 12 L d T per token, Kaplan et al.) over the
  devices' peak at ASSUMED_MFU in the precision the cell trains in: HPCDP_PEAK_FLOPS (FLOP/s
  per device), else `cluster.gpu_type` naming a GPU of hpcdp/peaks.py's table, else (no or an
  unlisted gpu_type) the slowest GPU of that table, an assumption the estimate states.

A cell the table has no peak for (a V100 in bf16) has no estimate: the others' sum is then a
lower bound, and the campaign says how many cells it leaves out; so has every cell on CPU
nodes (cluster.gpus_per_node 0) without HPCDP_PEAK_FLOPS. No torch: the CLI calls this.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from hpcdp import peaks, run_folder
from hpcdp.config import MODEL_PRESETS, ClusterProfile, Experiment
from hpcdp.errors import one_line
from hpcdp.run_folder import METRICS_FILE

ASSUMED_MFU = 0.3
"""Share of the peak a GPT-2 step reaches: 30-45% is typical of well-fed GPUs with AMP; the low
end, so that an estimate errs long."""
START_UP_S = 15.0
"""Per cell: Python, torch and transformers imports, the process group, the data, the first
steps (7-10 s a cell on the local cluster, tiny model, imports cached; more on a busy shared
file system or with torch.compile)."""
PROBE_S = 15.0
"""Per network probe (start-up included)."""
DEFAULT_REQUEUES = 3
"""HPCDP_MAX_REQUEUES when unset or not a whole number, as the job scripts take it."""


@dataclass(frozen=True)
class Estimate:
    seconds: float | None
    """The cells' and probes' time; None when no cell has a step time to go by. With `missing`
    cells, a lower bound."""
    how: str
    missing: int = 0
    """Cells without an estimate (left out of `seconds`)."""
    cells: int = 0
    why_missing: str = ""
    assumed: str | None = None
    """The GPU assumed for want of a known cluster.gpu_type (e.g. "V100"), or None."""


def flops_per_token(experiment: Experiment) -> float:
    """As train/ counts it for its MFU, from the model's shapes (without transformers)."""
    from hpcdp.forecast.memory import experiment_shapes

    n_layer, n_embd, _heads, _context = MODEL_PRESETS[experiment.model.preset]
    shapes = experiment_shapes(experiment)
    params = sum(math.prod(s) for s in shapes) - math.prod(shapes[1])  # no position embeddings
    return peaks.training_flops_per_token(params, n_layer, n_embd, experiment.train.seq_len)


def _precision(mixed: bool, experiment: Experiment) -> str:
    """What a cell trains in on a GPU, as train/precision.py resolves it (auto: fp16)."""
    if not mixed:
        return "fp32"
    return "fp16" if experiment.train.amp_dtype == "auto" else experiment.train.amp_dtype


def slowest_gpu(precision: str) -> str:
    """The GPU of hpcdp/peaks.py's table with the lowest peak in `precision`."""
    return min((table[precision], name) for name, table in peaks.PEAK_FLOPS.items()
               if table.get(precision))[1]


def _peak(profile: ClusterProfile, precision: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, the GPU assumed when the profile names none the table
    knows: the slowest one, so that the estimate errs long)."""
    gpu = profile.gpu_type or ""
    if os.environ.get(peaks.OVERRIDE) or peaks.known_gpu(gpu):
        return peaks.peak_flops(gpu, precision), None
    if not profile.gpus_per_node:  # CPU nodes: no GPU to assume
        return None, None
    assumed = slowest_gpu(precision)
    return peaks.PEAK_FLOPS[assumed][precision], assumed


def _earlier_step_times(root: Path, experiment: Experiment) -> dict[tuple, float]:
    """(strategy, nodes, world) -> median step time of the newest finished run like it."""
    found: dict[tuple, tuple[float, float]] = {}
    for metrics in root.rglob(METRICS_FILE) if root.is_dir() else []:
        header, tail = run_folder.head_and_tail(metrics)  # as `hpcdp status` reads it
        if not header or not tail:
            continue
        summary = tail[-1]
        config = header.get("config") or {}
        train, model = config.get("train") or {}, config.get("model") or {}
        if (summary.get("kind") != "summary" or not summary.get("step_time_s_median")
                or model.get("preset") != experiment.model.preset
                or train.get("seq_len") != experiment.train.seq_len
                or train.get("micro_batch_size") != experiment.train.micro_batch_size):
            continue
        key = (header.get("strategy"), header.get("nodes"), header.get("world_size"))
        when = metrics.stat().st_mtime
        if key not in found or when > found[key][0]:
            found[key] = (when, float(summary["step_time_s_median"]))
    return {k: v for k, (_, v) in found.items()}


def campaign(plan, profile: ClusterProfile, experiment: Experiment) -> Estimate:
    """The campaign's duration: every cell's steps x step time plus start-up, and the probes."""
    root = plan.folder.parent
    earlier = _earlier_step_times(root, experiment)
    per_token = flops_per_token(experiment)
    total, sources, missing, assumed = 0.0, set(), [], {}
    for cell in plan.cells:
        job = cell.job
        world = cell.nodes * job.tasks_per_node
        step = earlier.get((cell.strategy.name, cell.nodes, world))
        if step is not None:
            sources.add("earlier runs of these cells")
        else:
            precision = _precision(cell.strategy.mixed_precision, experiment)
            peak, gpu = _peak(profile, precision)
            if peak is None:
                missing.append(f"{cell.key} ({precision})")
                continue
            if gpu:
                assumed.setdefault(gpu, precision)
            replicas = cell.nodes * cell.strategy.replicas_per_node(profile.gpus_per_node,
                                                                    job.tasks_per_node)
            devices = max(replicas, cell.nodes * cell.strategy.gpus_per_node(
                profile.gpus_per_node))
            tokens = (experiment.train.seq_len * experiment.train.micro_batch_size * replicas
                      * experiment.train.accum_steps(replicas))
            step = tokens * per_token / (peak * devices * ASSUMED_MFU)
            sources.add(f"FLOPs at {ASSUMED_MFU:.0%} of the peak")
        total += experiment.train.steps * step + START_UP_S
    total += PROBE_S * (len(plan.probes) + len(plan.probes_end))
    why = ""
    if missing:
        cells = f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
        why = (f"no earlier run of them under {root}, and " + (
            f"{profile.gpu_type} has no peak in their precision: {cells}; set HPCDP_PEAK_FLOPS "
            "or another train.amp_dtype" if profile.gpus_per_node else
            "CPU nodes (cluster.gpus_per_node 0) have no peak hpcdp knows: set "
            "HPCDP_PEAK_FLOPS (FLOP/s per rank)"))
    if len(missing) == len(plan.cells) and plan.cells:
        return Estimate(None, "", len(missing), len(plan.cells), why)
    gpu = " and ".join(f"{name} ({precision})" if len(assumed) > 1 else name
                       for name, precision in assumed.items()) or None
    return Estimate(total, " and ".join(sorted(sources)) or "start-up only", len(missing),
                    len(plan.cells), why, gpu)


def max_requeues() -> tuple[int, list[str]]:
    """HPCDP_MAX_REQUEUES as the job scripts read it (unset, empty or not a whole number: 3),
    and a warning line when it is not a whole number."""
    text = os.environ.get("HPCDP_MAX_REQUEUES", "")
    if not text:
        return DEFAULT_REQUEUES, []
    if text.isascii() and text.isdigit():
        return int(text), []
    return DEFAULT_REQUEUES, [f"hpcdp: warning: HPCDP_MAX_REQUEUES={one_line(text)!r} is not a "
                              f"whole number (0, 1, 2, ...); the job will requeue at most "
                              f"{DEFAULT_REQUEUES} times, as if it were unset"]


def format_seconds(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def lines(plan, profile: ClusterProfile, experiment: Experiment) -> list[str]:
    """What `hpcdp compare` prints: the estimate, and a warning when the time limit with its
    requeues cannot cover it."""
    guess = campaign(plan, profile, experiment)
    if guess.seconds is None:
        return [f"hpcdp: campaign duration: no estimate for {guess.missing} of {guess.cells} "
                f"cells ({guess.why_missing})"]
    limit = profile.time_limit_s()
    requeues, out = max_requeues()
    about = "at least" if guess.missing else "about"
    out.append(f"hpcdp: campaign duration: {about} {format_seconds(guess.seconds)} (from "
               f"{guess.how}; time limit {profile.time_limit} per run of the job)")
    if guess.assumed:
        told = (f"cluster.gpu_type {profile.gpu_type!r} is not in hpcdp's table of peaks"
                if profile.gpu_type else "cluster.gpu_type is not set")
        known = ", ".join(name.lower() for name in peaks.PEAK_FLOPS)
        out.append(f"hpcdp: the estimate assumes {guess.assumed} GPUs, the slowest hpcdp knows "
                   f"({told}); set cluster.gpu_type ({known}) or HPCDP_PEAK_FLOPS for a better "
                   "estimate")
    if guess.missing:
        out.append(f"hpcdp: {guess.missing} of {guess.cells} cells have no estimate, so the "
                   f"campaign takes longer than that ({guess.why_missing})")
    if guess.seconds > limit * (1 + requeues):
        out.append(f"hpcdp: warning: the campaign needs {about} {format_seconds(guess.seconds)},"
                   f" more than cluster.time_limit {profile.time_limit} with {requeues} "
                   f"requeues can give ({format_seconds(limit * (1 + requeues))}): raise "
                   "cluster.time_limit, set HPCDP_MAX_REQUEUES, or run fewer cells or steps")
    elif guess.seconds > limit:
        out.append(f"hpcdp: the campaign will requeue itself about "
                   f"{int(guess.seconds // limit)} time(s) to finish (HPCDP_MAX_REQUEUES "
                   f"{requeues})")
    return out
