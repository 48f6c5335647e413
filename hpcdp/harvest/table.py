"""From read runs to the comparison: one RunResult per run, the derived columns, and the
table/markdown/csv/json renderings. Every column is defined in docs/harvest.md."""

from __future__ import annotations

import csv
import io
import json
import os
import statistics
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from hpcdp import strategies
from hpcdp.config import TrainConfig
from hpcdp.harvest import layout, stats
from hpcdp.harvest.read import MetricsLog

# For headers without a config: what the trainer would have used.
DEFAULT_WARMUP_LOG_STEPS = TrainConfig().warmup_log_steps
BASELINE_STRATEGY = strategies.BASELINE.name
BASELINE_PRECISION = "fp32"
# A run without a summary whose last record is younger than this may still be writing.
RUNNING_GRACE_S = 120.0
# Training settings two runs must share to be compared (speed-up, scaling, time to target,
# "same configuration"), read from each header's resolved config. Logging, evaluation and
# checkpoint intervals are left out: they do not change what is trained.
COMPARED_SETTINGS = (
    "model.preset", "model.dropout", "model.attention", "data.corpus", "data.tokenizer",
    "data.vocab_size", "train.seq_len", "train.micro_batch_size", "train.grad_accum_steps",
    "train.steps", "train.lr", "train.min_lr", "train.warmup_steps", "train.weight_decay",
    "train.grad_clip", "train.seed", "train.amp_dtype", "train.compile", "train.scaling",
    "train.global_batch_size",
)
FINISHED_STATES = ("COMPLETED", "COMPLETED-by-log")


@dataclass
class RunResult:
    """One run's row in the comparison, plus what it took to get there."""

    run_dir: str
    experiment: str | None
    strategy: str | None
    nodes: int | None
    world_size: int | None
    global_batch: int | None
    """Sequences per optimizer step over all replicas (header global_batch_size)."""
    precision: str | None
    device: str | None
    communication: str | None
    """How gradients travelled (header `communication`): gloo, nccl, horovod-mpi, ..., with
    `/bf16` or `/fp16` added when train.grad_comm compressed them."""
    job_id: str | None
    state: str
    state_source: str
    """"sacct" / "squeue" (Slurm said so), "log" (read from metrics.jsonl only)."""
    exit_code: int | None
    steps: int
    """Distinct steps logged (the last value per step counts)."""
    last_step: int | None
    planned_steps: int | None
    segments: int
    restarts: int
    corrupt_lines: int
    truncated: bool
    tokens_per_s: float | None
    step_time_s: float | None
    steady_steps: int
    exposed_comm_s: float | None = None
    """Median gradient communication per step that no computation hid (train/phases.py)."""
    allreduce_s: float | None = None
    """Median time of the step's whole gradient all-reduce, where measured (DDP)."""
    allreduce_bytes: float | None = None
    """Median bytes of that all-reduce per step, and of its calls (buckets) per step: training's
    own bus bandwidth and message size (repeats.attach_baseline)."""
    allreduce_calls: float | None = None
    tokens_per_elapsed_s: float | None = None
    """Tokens trained over the run's elapsed time (logging, evaluation, checkpoints, the stop
    agreement and warm-up included), summed over segments: tokens_per_elapsed."""
    speedup: float | None = None
    scaling_efficiency: float | None = None
    """tokens/s / (nodes x tokens/s of the same strategy and precision on 1 node)."""
    efficiency_vs_single: float | None = None
    """tokens/s / (world_size x tokens/s of single-gpu fp32 on 1 node)."""
    loss_drift: float | None = None
    """Largest relative difference of its loss from the parity reference at equal tokens."""
    parity_reference: str | None = None
    """The fp32 run of the same global batch its loss is checked against (short name)."""
    target_loss: float | None = None
    time_to_target_s: float | None = None
    step_to_target: int | None = None
    final_loss: float | None = None
    final_val_loss: float | None = None
    peak_mem_gb: float | None = None
    """Memory per rank: the largest over ranks and segments of the summary's memory.peak_bytes
    (GPU: max_memory_allocated; CPU: peak RSS), else rank 0's max_mem_gb over steps."""
    state_gb: float | None = None
    """Parameters, gradients and optimizer state one rank holds (the largest over ranks)."""
    memory_measured: str | None = None
    """What peak_mem_gb measured: cuda_max_allocated or peak_rss."""
    mfu: float | None = None
    max_rss: str | None = None
    malloc: str | None = None
    """The C allocator rank 0 ran with (header `malloc`: tcmalloc, jemalloc, system); None in
    logs from before it was recorded."""
    threads: int | None = None
    """Threads per process (header threads_per_process): part of the conditions."""
    cpus: int | None = None
    """CPUs each process could run on (header cpus_per_process): part of the conditions."""
    container: str | None = None
    """The container rank 0 ran in (header `container`: "oci /path/bundle"), None on the host:
    part of the conditions (another image is other software)."""
    step_cv: float | None = None
    """Coefficient of variation of its steady step times (stats.steadiness)."""
    step_drift: float | None = None
    """Median step time of the second half of its steady steps over the first's, minus 1."""
    equivalent_within: float | None = None
    """compare.equivalent_within of its experiment (the verdict's equivalence band)."""
    source: str = ""
    """The population it belongs to: its campaign's folder, or "" for separate jobs (hpcdp
    submit, sbatch). Runs of different sources are never compared (harvest sets it)."""
    settings: dict = field(default_factory=dict)
    """COMPARED_SETTINGS as the header's config holds them (None where it does not say)."""
    baseline: str | None = None
    """The run speed-up and efficiency vs 1 GPU are measured against (its short name)."""
    notes: list[str] = field(default_factory=list)
    # The loss curve, one entry per logged step with a loss, in step order (the loss-vs-time
    # figure and time to target). Parallel lists, not tuples: 10,000 steps x 100 runs.
    curve_step: list[int] = field(default_factory=list, repr=False)
    curve_time_s: list[float] = field(default_factory=list, repr=False)
    """Training time: summed over segments, queue waits between them left out."""
    curve_loss: list[float] = field(default_factory=list, repr=False)

    def key(self) -> tuple:
        """Sort key: experiment, the registry's strategy order, nodes, world, precision, dir."""
        order = {name: i for i, name in enumerate(strategies.NAMES)}
        return (self.experiment or "", order.get(self.strategy or "", len(order)),
                self.strategy or "", self.nodes or 0, self.world_size or 0, self.precision or "",
                self.run_dir)

    def tasks_per_node(self) -> int | None:
        return self.world_size // self.nodes if self.world_size and self.nodes else None

    def to_dict(self, with_curve: bool = False) -> dict:
        skip = () if with_curve else ("curve_step", "curve_time_s", "curve_loss")
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def short_name(run_dir: str | Path, run_dirs: list[Path]) -> str:
    """A run's path relative to the folder all runs share (its name when alone)."""
    if len(run_dirs) < 2:
        return Path(run_dir).name
    common = os.path.commonpath([str(p) for p in run_dirs])
    return os.path.relpath(str(run_dir), common)


_NUMS = (int, float)  # JSON numbers; bool (a subclass of int) is left out on purpose


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _memory(log: MetricsLog) -> tuple[float | None, float | None, str | None]:
    """(peak GB, model state GB, what was measured) per rank from the segments' summaries
    (train/memory.py: each the largest over the segment's ranks), the largest segment."""
    found = [s.summary["memory"] for s in log.segments
             if s.summary and isinstance(s.summary.get("memory"), dict)]
    peaks = [_number(m.get("peak_bytes")) for m in found]
    states = [sum(_number(m.get(k)) or 0.0 for k in ("params_bytes", "grads_bytes",
                                                      "optimizer_bytes")) for m in found]
    peaks = [p for p in peaks if p is not None]
    if not peaks:
        return None, None, None
    measured = found[0].get("measured")
    return (max(peaks) / 1e9, max(states) / 1e9 if states else None,
            measured if isinstance(measured, str) else None)


def warmup_log_steps(header: dict) -> int:
    """Steps left out of medians after each segment start: config.train.warmup_log_steps."""
    value = ((header.get("config") or {}).get("train") or {}).get("warmup_log_steps")
    return value if isinstance(value, int) and value >= 0 else DEFAULT_WARMUP_LOG_STEPS


def steady_rows(log: MetricsLog) -> list[int]:
    """Rows of steady steps: past the warm-up of the segment that wrote them (a resumed segment
    warms up again: allocator, compilation, data loader), as train/loop.py's own summary does."""
    steady_after = []
    for seg in log.segments:
        start = seg.header.get("start_step")
        start = start if isinstance(start, int) else (seg.first_step or 1) - 1
        steady_after.append(start + warmup_log_steps(seg.header))
    step_of, seg_of = log.columns.step, log.columns.seg
    return [i for i in log.order if step_of[i] > steady_after[seg_of[i]]]


def summarize_log(run_dir: Path, log: MetricsLog) -> RunResult:
    """The per-run numbers that need nothing but the run's own metrics."""
    header = log.header
    c, order = log.columns, log.order
    step_of, steady = c.step, steady_rows(log)
    timed = steady or order  # a run shorter than its warm-up: use what there is

    def present(column: list, rows: list[int]) -> list[float]:
        return [v for v in map(column.__getitem__, rows) if v is not None]

    with_loss = [i for i in order if c.loss[i] is not None]
    losses = list(map(c.loss.__getitem__, with_loss))
    tps, dts, mfus = present(c.tokens_per_s, timed), present(c.step_time_s, timed), present(
        c.mfu, timed)
    exposed, allreduce = present(c.exposed_comm_s, timed), present(c.allreduce_s, timed)
    sent, calls = present(c.allreduce_bytes, timed), present(c.allreduce_calls, timed)
    mems = present(c.max_mem_gb, order)
    peak_gb, state_gb, measured = _memory(log)
    final_val = log.evals[max(log.evals)] if log.evals else None
    if final_val is None and log.summary:
        final_val = _number(log.summary.get("final_val_loss"))
    planned = ((header.get("config") or {}).get("train") or {}).get("steps")
    config = header.get("config") if isinstance(header.get("config"), dict) else {}
    cv, drift = stats.steadiness(dts) if steady else (None, None)
    band = (config.get("compare") or {}).get("equivalent_within") if isinstance(
        config.get("compare"), dict) else None
    settings = _compared_settings(config)
    # A segment that trained no step (a run started again after its last step) is no resume.
    trained = sum(s.first_step is not None for s in log.segments)
    return RunResult(
        run_dir=str(run_dir), experiment=header.get("experiment"),
        strategy=header.get("strategy"), nodes=header.get("nodes"),
        world_size=header.get("world_size"), precision=header.get("precision"),
        global_batch=header.get("global_batch_size") if isinstance(
            header.get("global_batch_size"), int) else None,
        device=header.get("device"), communication=_communication(header), job_id=None,
        state="UNKNOWN", state_source="log",
        exit_code=None, steps=len(order), last_step=step_of[order[-1]] if order else None,
        planned_steps=planned if isinstance(planned, int) else None,
        segments=max(1, trained) if log.segments else 0,
        restarts=max([trained - 1] + [
            s.header.get("restart_count") for s in log.segments
            if isinstance(s.header.get("restart_count"), int)]),
        corrupt_lines=log.corrupt_lines, truncated=log.truncated,
        tokens_per_s=_median(tps), step_time_s=_median(dts), steady_steps=len(steady),
        exposed_comm_s=_median(exposed), allreduce_s=_median(allreduce),
        allreduce_bytes=_median(sent), allreduce_calls=_median(calls),
        tokens_per_elapsed_s=tokens_per_elapsed(log),
        final_loss=losses[-1] if losses else None,
        final_val_loss=final_val, state_gb=state_gb, memory_measured=measured,
        peak_mem_gb=peak_gb if peak_gb is not None else max(mems) if mems else None,
        mfu=_median(mfus), curve_step=list(map(step_of.__getitem__, with_loss)),
        curve_time_s=list(map(c.t.__getitem__, with_loss)), curve_loss=losses,
        malloc=header.get("malloc") if isinstance(header.get("malloc"), str) else None,
        threads=_count(header.get("threads_per_process")),
        cpus=_count(header.get("cpus_per_process")),
        container=header.get("container") if isinstance(header.get("container"), str) else None,
        step_cv=cv, step_drift=drift,
        equivalent_within=_number(band), settings=settings,
    )


def _compared_settings(config: dict) -> dict:
    """COMPARED_SETTINGS as a header's config holds them (None where it does not say)."""
    settings = {}
    for key in COMPARED_SETTINGS:
        section, name = key.split(".")
        part = config.get(section)
        settings[key] = part.get(name) if isinstance(part, dict) else None
    return settings


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tokens_per_elapsed(log: MetricsLog) -> float | None:
    """The run's tokens over its elapsed training time: each segment's `train_elapsed_s`
    (summary: its first step's start to its loop's end), or, for a segment killed before its
    summary, its last step's `elapsed_s`. Steps redone after a requeue count once, the time
    they took twice: work lost to a kill is in it, as in the training-time axis."""
    tokens_per_step = log.header.get("tokens_per_step")
    steps = [log.columns.step[i] for i in log.order]
    if not steps or not isinstance(tokens_per_step, int) or not log.segments:
        return None
    start = log.segments[0].header.get("start_step")
    tokens = (max(steps) - (start if isinstance(start, int) else 0)) * tokens_per_step
    elapsed = 0.0
    for seg in log.segments:
        wall = _number((seg.summary or {}).get("train_elapsed_s"))
        elapsed += wall if wall is not None else seg.last_elapsed_s
    return tokens / elapsed if elapsed > 0 and tokens > 0 else None


def _communication(header: dict) -> str | None:
    comm, grad_comm = header.get("communication"), header.get("grad_comm")
    if comm and grad_comm in ("bf16", "fp16"):
        return f"{comm}/{grad_comm}"
    return comm


def state_from_log(result: RunResult, log: MetricsLog, now: float | None = None) -> str:
    """When Slurm cannot say: COMPLETED-by-log with a "completed" summary, INCOMPLETE with an
    "interrupted" one (stopped by a signal), else RUNNING-by-log while the file is fresh, else
    INCOMPLETE."""
    if log.summary is not None:
        return "COMPLETED-by-log" if log.summary.get("status", "completed") == "completed" \
            else "INCOMPLETE"
    now = time.time() if now is None else now
    grace = max(RUNNING_GRACE_S, 10 * (result.step_time_s or 0.0))
    if log.last_time is not None and now - log.last_time < grace:
        return "RUNNING-by-log"
    return "INCOMPLETE"


def _preferred(runs: list[RunResult]) -> RunResult:
    """The run to compare against among equals, by rule: a finished one first, then the one
    with the most steady steps, then the sort order (never a cancelled run by folder name)."""
    return min(runs, key=lambda r: (r.state not in FINISHED_STATES, -r.steady_steps, r.key()))


def _frozen(settings: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in settings.items()))


def comparison_groups(results: list[RunResult]) -> list[list[RunResult]]:
    """Runs that may be compared: one experiment, one source (a campaign, or separate jobs:
    populations measured under different conditions are never pooled), the same
    COMPARED_SETTINGS. Largest group of each experiment and source first, so that it is the one
    the others are described against."""
    by_key: dict[tuple, list[RunResult]] = {}
    for r in sorted(results, key=RunResult.key):
        by_key.setdefault((r.experiment or "", r.source, _frozen(r.settings)), []).append(r)
    return sorted(by_key.values(),
                  key=lambda g: (g[0].experiment or "", g[0].source, -len(g), g[0].key()))


def _differences(settings: dict, reference: dict, limit: int = 3) -> str:
    diffs = [f"{k}={settings.get(k)!r} (there {reference.get(k)!r})" for k in COMPARED_SETTINGS
             if settings.get(k) != reference.get(k)]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return ", ".join(diffs[:limit]) + more


def fill_comparisons(results: list[RunResult], target_loss: float | None,
                     name_of=lambda r: r.run_dir) -> float | None:
    """Speed-up, scaling efficiency, time to target and "same configuration", each only among
    runs trained alike (comparison_groups); rows trained differently from the largest group of
    their experiment say how. Returns the target loss of the first group.

    Default target: the highest final loss in the group, so that every run of it reaches it.
    """
    first_target = None
    largest: dict[tuple, RunResult] = {}
    for group in comparison_groups(results):
        reference = largest.setdefault((group[0].experiment or "", group[0].source),
                                       _preferred(group))
        if reference not in group:
            for r in group:
                r.notes.append(f"trained differently from {name_of(reference)}: "
                               f"{_differences(r.settings, reference.settings)}; not compared")
        target = _fill_group(group, target_loss, name_of)
        first_target = target if first_target is None else first_target
    return first_target


def _label_alike(group: list[RunResult], name_of) -> None:
    """A note on runs of one configuration: a campaign's repeats numbered, a retried attempt
    named, other duplicates pointed at the run compared against."""
    same: dict[tuple, list[RunResult]] = {}
    for r in group:
        same.setdefault((r.strategy, r.nodes, r.world_size, r.precision, r.communication),
                        []).append(r)
    for runs in same.values():
        chosen = _preferred(runs)
        repeats = [r for r in runs if _repeat_number(r) is not None]
        for r in runs:
            name = Path(r.run_dir).name
            if ".failed" in name:  # hpcdp compare set a failed attempt aside and retried it
                retry = Path(r.run_dir).with_name(name.split(".failed")[0])
                r.notes.append(f"failed attempt, retried as {retry.name}; not a repeat")
            elif _repeat_number(r) is not None:  # a campaign's repeats are peers: numbered,
                # none "a repeat of" another (repeat-1 read "repeat of .../repeat-2")
                r.notes.append(f"repeat {_repeat_number(r)} of {len(repeats)}")
            elif r is not chosen:
                r.notes.append(f"same configuration as {name_of(chosen)}")


def _fill_group(group: list[RunResult], target_loss: float | None, name_of) -> float | None:
    _label_alike(group, name_of)
    measured = [r for r in group if r.tokens_per_s is not None]
    baselines = [r for r in measured if r.nodes == 1 and r.strategy == BASELINE_STRATEGY
                 and r.precision == BASELINE_PRECISION]
    base = _preferred(baselines) if baselines else None

    def one_node_reference(r: RunResult) -> RunResult | None:
        # The same strategy and precision on 1 node: with the same processes per node when
        # there is such a run (4 ranks on 2 nodes vs 2 ranks on 1), else any.
        alike = [o for o in measured if o.nodes == 1 and (o.strategy, o.precision) ==
                 (r.strategy, r.precision)]
        exact = [o for o in alike if o.tasks_per_node() == r.tasks_per_node()]
        return _preferred(exact or alike) if alike else None

    for r in measured:
        if base is not None:
            r.baseline = name_of(base)
            if r.malloc and base.malloc and r.malloc != base.malloc:  # auto differs by strategy
                r.notes.append(f"ran with malloc {r.malloc}, {r.baseline} with {base.malloc}: "
                               "on CPUs that alone changes step time")
            r.speedup = r.tokens_per_s / base.tokens_per_s
            if r.world_size:
                r.efficiency_vs_single = r.tokens_per_s / (r.world_size * base.tokens_per_s)
        ref = one_node_reference(r)
        if ref is not None and r.nodes and r.nodes > 1:  # 1 node against 1 node means nothing
            r.scaling_efficiency = r.tokens_per_s / (r.nodes * ref.tokens_per_s)
    _check_loss_parity(group, name_of)
    # Time to a loss compares like with like only at one global batch: another batch solves
    # another optimisation problem. Each global batch gets its own default target.
    first = None
    for batch in dict.fromkeys(r.global_batch for r in group):
        alike = [r for r in group if r.global_batch == batch]
        target = target_loss
        if target is None:
            finals = [r.final_loss for r in alike if r.final_loss is not None]
            target = max(finals) if finals else None
        first = target if first is None else first
        for r in alike if target is not None else []:
            r.target_loss = target
            for i, loss in enumerate(r.curve_loss):
                if loss <= target:
                    r.time_to_target_s, r.step_to_target = r.curve_time_s[i], r.curve_step[i]
                    break
    return first


def _repeat_number(r: RunResult) -> int | None:
    """k of a campaign's <cell>/repeat-<k> folder, else None."""
    name = Path(r.run_dir).name
    number = name.removeprefix("repeat-")
    return int(number) if name.startswith("repeat-") and number.isdigit() else None


LOSS_PARITY_RTOL = 0.01
"""A run whose loss differs from the fp32 reference of its global batch by more than this
(relative) at any logged step trained different maths (bf16 all-reduce, a bug), not noise:
with the same samples and seed, fp32 strategies agree within 1e-5 here and bf16 autocast
within 2e-4."""


def _parity_reference(runs: list[RunResult]) -> RunResult | None:
    plain = [r for r in runs if r.precision == BASELINE_PRECISION and r.curve_loss
             and (r.communication or "").count("/") == 0]
    return min(plain, key=lambda r: (r.strategy != BASELINE_STRATEGY, r.nodes or 0,
                                     r.state not in FINISHED_STATES, r.key()), default=None)


def _check_loss_parity(group: list[RunResult], name_of) -> None:
    """Each run's loss at equal tokens (same global batch: same step) against the fp32
    reference of its global batch; a drift beyond LOSS_PARITY_RTOL becomes a note."""
    for batch in dict.fromkeys(r.global_batch for r in group):
        alike = [r for r in group if r.global_batch == batch]
        ref = _parity_reference(alike)
        if ref is None:
            continue
        ref_loss = dict(zip(ref.curve_step, ref.curve_loss))
        for r in alike:
            common = [(s, loss) for s, loss in zip(r.curve_step, r.curve_loss) if s in ref_loss]
            if r is ref or not common:
                continue
            r.parity_reference = name_of(ref)
            step, drift = max(((s, abs(loss - ref_loss[s]) / abs(ref_loss[s] or 1.0))
                               for s, loss in common), key=lambda x: x[1])
            r.loss_drift = drift
            if drift > LOSS_PARITY_RTOL:
                r.notes.append(f"loss drifts {drift:.1%} from {name_of(ref)} at step {step} "
                               f"(tolerance {LOSS_PARITY_RTOL:.0%}): the maths changed")


def baseline_lines(results: list[RunResult]) -> list[str]:
    """One line per baseline in use, and how time to target was compared, for the foot of the
    table."""
    names = list(dict.fromkeys(r.baseline for r in results if r.baseline))
    targets = dict.fromkeys((r.global_batch, r.target_loss) for r in results
                            if r.target_loss is not None)
    lines = []
    if len({batch for batch, _ in targets}) > 1:
        lines.append("time to target compares runs of one global batch only (another batch "
                     "trains another problem): " + "; ".join(
                         f"batch {batch}: target {target:.4f}" for batch, target in targets))
    return lines + [f"speed-up and efficiency vs 1 GPU are against {name} "
                    f"({BASELINE_STRATEGY}, {BASELINE_PRECISION}, 1 node; chosen as finished, "
                    "then most steps)" for name in names]


# ------------------------------------------------------------------------------ rendering

COLUMNS: list[tuple[str, str]] = [
    # (RunResult field or derived name, column title)
    ("experiment", "experiment"),
    ("strategy", "strategy"),
    ("nodes", "nodes"),
    ("world_size", "world"),
    ("global_batch", "batch"),
    ("precision", "precision"),
    ("communication", "comm"),
    ("state", "state"),
    ("steps", "steps"),
    ("tokens_per_s", "tokens/s"),
    ("tokens_per_elapsed_s", "tokens/elapsed s"),
    ("step_time_ms", "step ms"),
    ("speedup", "speed-up"),
    ("scaling_efficiency", "scaling eff"),
    ("efficiency_vs_single", "eff vs 1 GPU"),
    ("time_to_target_s", "time to target s"),
    ("final_loss", "final loss"),
    ("final_val_loss", "val loss"),
    ("peak_mem_gb", "mem/rank GB"),
    ("state_gb", "state/rank GB"),
    ("mfu", "MFU"),
    ("notes", "notes"),
]


def _cell(r: RunResult, name: str, for_csv: bool = False) -> str:
    if name == "step_time_ms":
        value = None if r.step_time_s is None else r.step_time_s * 1e3
    elif name == "notes":
        return "; ".join(r.notes)
    else:
        value = getattr(r, name)
    if value is None:
        return "" if for_csv else "-"
    if for_csv:
        return repr(value) if isinstance(value, float) else str(value)
    if name in ("tokens_per_s", "tokens_per_elapsed_s"):
        return f"{value:,.0f}"
    if name in ("speedup",):
        return f"{value:.2f}x"
    if name in ("scaling_efficiency", "efficiency_vs_single", "mfu"):
        return f"{100 * value:.1f}%"
    if name in ("final_loss", "final_val_loss"):
        return f"{value:.4f}"
    if name in ("step_time_ms", "time_to_target_s"):
        return f"{value:.1f}"
    if name in ("peak_mem_gb", "state_gb"):
        return f"{value:.2f}"
    return str(value)


def _columns(results: list[RunResult]) -> list[tuple[str, str]]:
    """All columns; experiment only when runs of several experiments are compared."""
    if len({r.experiment for r in results}) > 1:
        return COLUMNS
    return [c for c in COLUMNS if c[0] != "experiment"]


RIGHT = {"nodes", "world_size", "global_batch", "steps", "tokens_per_s", "tokens_per_elapsed_s",
         "step_time_ms", "speedup", "scaling_efficiency", "efficiency_vs_single",
         "time_to_target_s", "final_loss", "final_val_loss", "peak_mem_gb", "state_gb", "mfu"}
NARROW_PRIORITY = ("strategy", "nodes", "world_size", "precision", "state", "tokens_per_s",
                   "speedup", "scaling_efficiency", "final_loss", "peak_mem_gb", "step_time_ms",
                   "communication", "steps", "experiment", "global_batch", "efficiency_vs_single",
                   "time_to_target_s", "state_gb", "final_val_loss", "tokens_per_elapsed_s",
                   "mfu")
"""Which columns a narrow terminal keeps first; notes are always kept, wrapped, last."""


def render_table(results: list[RunResult], width: int | None = None) -> str:
    """Plain text, aligned columns (the terminal default); within `width` characters the
    columns that fit (NARROW_PRIORITY) and the notes wrapped, else every column."""
    cols = _columns(results)
    names = [name for name, _ in cols]
    rows = [[title for _, title in cols]] + [[_cell(r, name) for name in names] for r in results]
    return "\n".join(layout.fit(rows, width, left={i for i, n in enumerate(names)
                                                  if n not in RIGHT},
                               priority=[names.index(n) for n in NARROW_PRIORITY if n in names],
                               wrap=names.index("notes")))


def render_markdown(results: list[RunResult], target_loss: float | None = None) -> str:
    cols = _columns(results)
    lines = ["| " + " | ".join(title for _, title in cols) + " |",
             "|" + "|".join("---:" if name not in ("strategy", "precision", "state", "notes",
                                                   "experiment", "communication") else "---"
                            for name, _ in cols) + "|"]
    for r in results:
        lines.append("| " + " | ".join(_cell(r, name).replace("|", "\\|") for name, _ in cols)
                     + " |")
    if target_loss is not None:
        lines.append("")
        lines.append(f"Target loss for 'time to target': {target_loss:.4f}.")
    for line in baseline_lines(results):
        lines += ["", line[0].upper() + line[1:] + "."]
    return "\n".join(lines)


CSV_FIELDS = ["run_dir", "experiment", "strategy", "nodes", "world_size", "global_batch",
              "precision", "device",
              "communication", "job_id", "state", "state_source", "exit_code", "steps", "last_step",
              "planned_steps", "segments", "restarts", "corrupt_lines", "truncated",
              "tokens_per_s", "tokens_per_elapsed_s", "step_time_s", "steady_steps",
              "exposed_comm_s", "allreduce_s", "allreduce_bytes", "allreduce_calls",
              "speedup",
              "scaling_efficiency",
              "efficiency_vs_single", "baseline", "loss_drift", "parity_reference",
              "target_loss", "time_to_target_s", "step_to_target",
              "final_loss", "final_val_loss", "peak_mem_gb", "state_gb", "memory_measured", "mfu",
              "max_rss", "notes"]


def render_csv(results: list[RunResult]) -> str:
    """Full precision, machine-readable: every field, units in names (s, gb), no formatting."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for r in results:
        writer.writerow([_cell(r, name, for_csv=True) if name != "notes" else "; ".join(r.notes)
                         for name in CSV_FIELDS])
    return buf.getvalue()


def render_json(results: list[RunResult], target_loss: float | None,
                accounting: dict | None = None, cells: list[dict] | None = None,
                verdict: list[dict] | None = None, baseline: list[dict] | None = None) -> str:
    """Every run, and (from harvest/repeats.py) every cell over its repeats, the verdict per
    node count and a campaign's network baseline."""
    return json.dumps({"target_loss": target_loss, "accounting": accounting or {},
                       "runs": [r.to_dict() for r in results], "cells": cells or [],
                       "verdict": verdict or [], "baseline": baseline or []}, indent=2) + "\n"
