"""How long a campaign will take, said before it is submitted, against the time it may take.

A campaign runs every cell one after another, so its time limit must cover the sum of them (or
the requeues must: near the limit the campaign checkpoints and requeues itself, at most
HPCDP_MAX_REQUEUES times). Each cell's step time comes, in this order, from:

- an earlier run of the same cell (strategy, nodes, ranks, model, sequence length, micro batch)
  under the experiment's output folder: the median step time its summary recorded;
- the model's training FLOPs per step (6N + 12 L d T per token, Kaplan et al.) over the
  devices' peak at ASSUMED_MFU, where the peak is known: `cluster.gpu_type` naming a GPU of
  hpcdp/peaks.py's table, or HPCDP_PEAK_FLOPS (FLOP/s per device);

else the cell has no estimate, and the campaign says so. No torch: the CLI calls this.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpcdp import peaks, progress
from hpcdp.config import MODEL_PRESETS, ClusterProfile, Experiment

ASSUMED_MFU = 0.3
"""Share of the peak a GPT-2 step reaches: 30-45% is typical of well-fed GPUs with AMP; the low
end, so that an estimate errs long."""
START_UP_S = 15.0
"""Per cell: Python, torch and transformers imports, the process group, the data, the first
steps (7-10 s a cell on the local cluster, tiny model, imports cached; more on a busy shared
file system or with torch.compile)."""
PROBE_S = 15.0
"""Per network probe (start-up included)."""
VOCAB = {"bytes": 256, "gpt2": 50257}


@dataclass(frozen=True)
class Estimate:
    seconds: float | None
    """None when some cell has no step time to go by."""
    how: str


def _vocab(experiment: Experiment) -> int:
    return VOCAB.get(experiment.data.tokenizer) or experiment.data.vocab_size or 50257


def flops_per_token(experiment: Experiment) -> float:
    n_layer, n_embd, _heads, _context = MODEL_PRESETS[experiment.model.preset]
    params = 12 * n_layer * n_embd ** 2 + _vocab(experiment) * n_embd  # tied head, no wpe
    return 6 * params + 12 * n_layer * n_embd * experiment.train.seq_len


def _peak(profile: ClusterProfile, precision: str) -> float | None:
    if os.environ.get(peaks.OVERRIDE) or profile.gpu_type:
        return peaks.peak_flops(profile.gpu_type or "", precision)
    return None


def _earlier_step_times(root: Path, experiment: Experiment) -> dict[tuple, float]:
    """(strategy, nodes, world) -> median step time of the newest finished run like it."""
    found: dict[tuple, tuple[float, float]] = {}
    for metrics in root.rglob("metrics.jsonl") if root.is_dir() else []:
        try:  # the first line and the last 64 KB, as `hpcdp status` reads them
            head, tail = progress.head_and_tail(metrics)
            header, summary = json.loads(head), json.loads(tail.splitlines()[-1])
        except (OSError, ValueError, IndexError):
            continue
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
    total, sources, missing = 0.0, set(), []
    for cell in plan.cells:
        job = cell.job
        world = cell.nodes * job.tasks_per_node
        step = earlier.get((cell.strategy.name, cell.nodes, world))
        if step is not None:
            sources.add("earlier runs of these cells")
        else:
            precision = "bf16" if cell.strategy.mixed_precision else "fp32"
            peak = _peak(profile, precision)
            if peak is None:
                missing.append(cell.key)
                continue
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
    if missing:
        return Estimate(None, f"no estimate for {len(missing)} of {len(plan.cells)} cells (no "
                              f"earlier run of them under {root}, and no known device peak: "
                              "set cluster.gpu_type, e.g. a100, or HPCDP_PEAK_FLOPS)")
    return Estimate(total, " and ".join(sorted(sources)) or "start-up only")


def format_seconds(seconds: float) -> str:
    hours, rest = divmod(int(round(seconds)), 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def lines(plan, profile: ClusterProfile, experiment: Experiment) -> list[str]:
    """What `hpcdp compare` prints: the estimate, and a warning when the time limit with its
    requeues cannot cover it."""
    guess = campaign(plan, profile, experiment)
    if guess.seconds is None:
        return [f"hpcdp: campaign duration: {guess.how}"]
    limit = profile.time_limit_s()
    requeues = int(os.environ.get("HPCDP_MAX_REQUEUES", "3") or 3)
    out = [f"hpcdp: campaign duration: about {format_seconds(guess.seconds)} (from {guess.how};"
           f" time limit {profile.time_limit} per run of the job)"]
    if guess.seconds > limit * (1 + requeues):
        out.append(f"hpcdp: warning: the campaign needs about {format_seconds(guess.seconds)},"
                   f" more than cluster.time_limit {profile.time_limit} with {requeues} "
                   f"requeues can give ({format_seconds(limit * (1 + requeues))}): raise "
                   "cluster.time_limit, set HPCDP_MAX_REQUEUES, or run fewer cells or steps")
    elif guess.seconds > limit:
        out.append(f"hpcdp: the campaign will requeue itself about "
                   f"{int(guess.seconds // limit)} time(s) to finish (HPCDP_MAX_REQUEUES "
                   f"{requeues})")
    return out
