"""Repeated cells (`hpcdp compare`): each cell's runs reduced to a median with its interval,
speed-up and scaling efficiency with theirs, and a verdict per node count (stats.decide). The
per-run table stays as it is; this is the summary under it.

A cell is one (strategy, nodes, world, precision, communication) under one set of conditions
(CONDITIONS: allocator, threads and CPUs per process, container) in one source (a campaign, or
separate jobs) and one comparison group (runs trained alike, table.comparison_groups). Cells of
different sources or conditions are never compared: a verdict across them would measure the
difference in conditions. Only finished runs with a throughput count as runs; the others are
counted as failed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import strategies as registry
from hpcdp.harvest import layout, stats
from hpcdp.harvest.table import (
    BASELINE_PRECISION,
    BASELINE_STRATEGY,
    FINISHED_STATES,
    LOSS_PARITY_RTOL,
    RunResult,
    comparison_groups,
)


@dataclass
class Cell:
    experiment: str | None
    strategy: str | None
    nodes: int | None
    world_size: int | None
    precision: str | None
    communication: str | None
    conditions: tuple
    """CONDITIONS, as its runs had them."""
    runs: list[RunResult] = field(repr=False)
    source: str = ""
    """Its campaign's folder, or "" for separate jobs."""
    failed: int = 0
    """Attempts of this cell that did not finish (a campaign retried each once: a failed
    attempt whose retry finished is counted here and its retry among the runs)."""
    median: float = 0.0
    interval: stats.Interval | None = None
    """The 95% interval of the median, or the range where the runs are too few for one."""
    speedup: stats.Effect | None = None
    """Against single-gpu fp32 on 1 node of its source (Hodges-Lehmann, exact interval)."""
    is_baseline: bool = False
    """It is that single-gpu cell: speed-up 1.00x by definition, no interval."""
    scaling: stats.Effect | None = None
    """Speed-up over the same strategy and precision on 1 node, divided by the nodes; only for
    nodes > 1."""
    unsettled: list[str] = field(default_factory=list)
    """Its runs that reached no steady state: "repeat-2 (step times vary 14%)"."""
    loss_failure: str | None = None
    """Why it fails loss parity (then it may not win), else None."""
    vs_fastest: str = ""
    """Its comparison with the verdict's leader, for the table."""
    allreduce_s: float | None = None
    """The network baseline's median time for one gradient all-reduce on this transport and
    world (hpcdp compare), where it was measured."""
    allreduce_share: float | None = None
    """allreduce_s / this cell's median step time: the share of a step one un-overlapped
    gradient all-reduce would take (communication that backward hides does not count)."""
    bandwidth_reached: float | None = None
    """Training's own bus bandwidth (bytes all-reduced per step / the summed time a bucket was
    in flight, x 2(n-1)/n) over the probe's bus bandwidth at training's message size (bytes per
    call, interpolated in the probe's sweep): the share of the measured bandwidth training
    reaches. Only where training times its all-reduce (DDP) and the sweep covers its size."""
    exposed_share: float | None = None
    """Median exposed gradient communication / median step time, over its runs."""
    memory_gb: float | None = None
    """Median over its runs of memory per rank (RunResult.peak_mem_gb), where recorded."""
    state_gb: float | None = None
    """Median over its runs of the parameters, gradients and optimizer state a rank holds
    (RunResult.state_gb): what sharding divides, without the process's other memory."""
    group: int = 0
    """Index of its comparison group: cells are compared only within one."""
    name: str = ""
    """e.g. "horovod 2n"; with tasks per node, transport and conditions where two cells of one
    group would share it."""

    def short_name(self) -> str:
        precision = "" if self.precision in (None, BASELINE_PRECISION) else f" {self.precision}"
        return f"{self.strategy}{precision} {self.nodes}n"

    def long_name(self) -> str:
        tasks = (self.world_size or 0) // (self.nodes or 1)
        return f"{self.short_name()} x{tasks} {self.communication or '-'}"

    def values(self) -> list[float]:
        return [r.tokens_per_s for r in self.runs if r.tokens_per_s is not None]

    def to_dict(self) -> dict:
        iv = self.interval
        return {"cell": self.name, "source": self.source, "experiment": self.experiment,
                "strategy": self.strategy, "nodes": self.nodes, "world_size": self.world_size,
                "precision": self.precision, "communication": self.communication,
                "conditions": dict(zip(CONDITIONS, self.conditions)),
                "repeats": len(self.runs), "failed": self.failed,
                "tokens_per_s_median": self.median if self.runs else None,
                "tokens_per_s_interval": _interval(iv),
                "tokens_per_s_range": [min(self.values()), max(self.values())]
                if self.runs else None,
                "speedup": _effect(self.speedup, self.is_baseline),
                "scaling_efficiency": _effect(self.scaling),
                "unsettled_runs": self.unsettled, "loss_failure": self.loss_failure,
                "vs_fastest": self.vs_fastest, "allreduce_s": self.allreduce_s,
                "allreduce_share_of_step": self.allreduce_share,
                "exposed_comm_share_of_step": self.exposed_share,
                "bandwidth_reached": self.bandwidth_reached,
                "memory_per_rank_gb": self.memory_gb, "state_per_rank_gb": self.state_gb,
                "runs": [r.run_dir for r in self.runs]}


def _interval(iv: stats.Interval | None) -> dict | None:
    if iv is None:
        return None
    return {"low": iv.low, "high": iv.high, "confidence": iv.level, "attained": iv.attained}


def _effect(effect: stats.Effect | None, exact: bool = False) -> dict | None:
    if exact:
        return {"estimate": 1.0, "interval": None}
    if effect is None:
        return None
    return {"estimate": effect.ratio, "interval": _interval(effect.interval)}


CONDITIONS = ("malloc", "threads", "cpus", "container")
"""What a cell's runs must share to be compared: the RunResult fields of the same names."""


def conditions_of(r: RunResult) -> tuple:
    return tuple(getattr(r, name) for name in CONDITIONS)


def describe_conditions(conditions: tuple) -> str:
    malloc, threads, cpus, container = conditions
    return (f"malloc {malloc or '?'}, {threads if threads is not None else '?'} thread(s), "
            f"{cpus if cpus is not None else '?'} CPU(s) per process"
            + (f", in container {container}" if container else ""))


def cells_of(results: list[RunResult]) -> list[Cell]:
    """One Cell per (strategy, nodes, world, precision, communication, conditions) of each
    comparison group (one source each), from its finished runs; in the per-run table's
    order."""
    out: list[Cell] = []
    for index, group in enumerate(comparison_groups(results)):
        by_key: dict[tuple, Cell] = {}
        failed: dict[tuple, int] = {}
        for r in group:
            key = (r.strategy, r.nodes, r.world_size, r.precision, r.communication,
                   conditions_of(r))
            if r.state not in FINISHED_STATES or r.tokens_per_s is None:
                failed[key[:5]] = failed.get(key[:5], 0) + 1
                continue
            by_key.setdefault(key, Cell(r.experiment, *key, runs=[], source=r.source,
                                        group=index)).runs.append(r)
        cells = list(by_key.values())
        for cell in cells:
            cell.failed = failed.get((cell.strategy, cell.nodes, cell.world_size,
                                      cell.precision, cell.communication), 0)
            cell.exposed_share = _exposed_share(cell.runs)
            values = cell.values()
            cell.median = stats.median(values)
            cell.interval = stats.median_interval(values)
            cell.unsettled = _unsettled(cell.runs)
            cell.loss_failure = _loss_failure(cell.runs)
            memory = [r.peak_mem_gb for r in cell.runs if r.peak_mem_gb is not None]
            cell.memory_gb = stats.median(memory) if memory else None
            state = [r.state_gb for r in cell.runs if r.state_gb is not None]
            cell.state_gb = stats.median(state) if state else None
        _name(cells)
        _fill_ratios(cells)
        out.extend(cells)
    return out


def _name(cells: list[Cell]) -> None:
    """Short names where they are unique in the group; else with tasks and transport; else
    with the conditions too."""
    shorts = [c.short_name() for c in cells]
    longs = [c.long_name() for c in cells]
    for cell in cells:
        if shorts.count(cell.short_name()) == 1:
            cell.name = cell.short_name()
        elif longs.count(cell.long_name()) == 1:
            cell.name = cell.long_name()
        else:
            cell.name = f"{cell.long_name()} [{describe_conditions(cell.conditions)}]"


def _run_name(r: RunResult) -> str:
    return Path(r.run_dir).name


def _unsettled(runs: list[RunResult]) -> list[str]:
    out = []  # the most variable first
    for r in sorted(runs, key=lambda r: -(r.step_cv or 0.0)):
        why = stats.unsettled_reason(r.step_cv, r.step_drift)
        if why:
            out.append(f"{_run_name(r)} ({why})")
    return out


def _unsettled_summary(cell: Cell) -> str:
    """'4 of 6 runs, e.g. repeat-2 (step times vary 27%)': the verdict line stays one line."""
    return f"{len(cell.unsettled)} of {len(cell.runs)} runs, e.g. {cell.unsettled[0]}"


def _loss_failure(runs: list[RunResult]) -> str | None:
    drifted = [r for r in runs if r.loss_drift is not None and r.loss_drift > LOSS_PARITY_RTOL]
    if not drifted:
        return None
    worst = max(drifted, key=lambda r: r.loss_drift)
    return (f"its loss drifts {worst.loss_drift:.1%} from {worst.parity_reference} "
            f"(tolerance {LOSS_PARITY_RTOL:.0%}): the maths changed")


def _exposed_share(runs: list[RunResult]) -> float | None:
    pairs = [(r.exposed_comm_s, r.step_time_s) for r in runs
             if r.exposed_comm_s is not None and r.step_time_s]
    if not pairs:
        return None
    return stats.median([e for e, _ in pairs]) / stats.median([s for _, s in pairs])


def attach_baseline(cells: list[Cell], baseline: list[dict]) -> None:
    """Each distributed cell's probe: of its own campaign (a probe explains only the cells
    measured beside it), transport and world, the one run at the campaign's start where there
    is one."""
    for cell in cells:
        comm = (cell.communication or "").split("/")[0]
        mine = [b for b in baseline
                if ((b.get("communication") or ""), b.get("world_size")) == (comm, cell.world_size)
                and b.get("campaign", cell.source) == cell.source
                and isinstance(b.get("median_s"), (int, float))]
        probe = min(mine, key=lambda b: b.get("when") != "start", default=None)
        if probe is None:
            continue
        cell.allreduce_s = float(probe["median_s"])
        steps = [r.step_time_s for r in cell.runs if r.step_time_s]
        if steps:
            cell.allreduce_share = cell.allreduce_s / stats.median(steps)
        cell.bandwidth_reached = _bandwidth_reached(cell, probe)


def _sweep(probe: dict) -> list[dict]:
    """The probe's sizes, ascending; a probe from before the sweep: its one (gradient) size."""
    sweep = probe.get("sweep")
    entries = sweep if isinstance(sweep, list) and sweep else [probe]
    return sorted((e for e in entries if isinstance(e, dict)
                   and isinstance(e.get("bytes"), (int, float)) and e["bytes"] > 0
                   and isinstance(e.get("busbw_GBps"), (int, float)) and e["busbw_GBps"] > 0),
                  key=lambda e: e["bytes"])


def busbw_at(probe: dict, nbytes: float) -> float | None:
    """The probe's bus bandwidth at `nbytes`, linear in log(size) between its two nearest
    sizes; None outside the sizes it measured (no extrapolation)."""
    sweep = _sweep(probe)
    for low, high in zip(sweep, sweep[1:] or sweep):
        if low["bytes"] <= nbytes <= high["bytes"]:
            if high["bytes"] == low["bytes"]:
                return float(low["busbw_GBps"])
            f = math.log(nbytes / low["bytes"]) / math.log(high["bytes"] / low["bytes"])
            return low["busbw_GBps"] + f * (high["busbw_GBps"] - low["busbw_GBps"])
    return None


def _bandwidth_reached(cell: Cell, probe: dict) -> float | None:
    n = cell.world_size or 0
    runs = [r for r in cell.runs if r.allreduce_s and r.allreduce_bytes and r.allreduce_calls]
    if n < 2 or not runs:
        return None
    own = stats.median([r.allreduce_bytes / r.allreduce_s / 1e9 * 2 * (n - 1) / n for r in runs])
    reference = busbw_at(probe, stats.median([r.allreduce_bytes / r.allreduce_calls
                                              for r in runs]))
    return own / reference if reference else None


def _fill_ratios(cells: list[Cell]) -> None:
    """Speed-up against single-gpu fp32 on 1 node; scaling efficiency (nodes > 1) against the
    same strategy and precision on 1 node (same tasks per node where there is such a cell).
    Only against cells of the same conditions: across them the ratio measures those."""
    for cell in cells:
        alike = [o for o in cells if o.conditions == cell.conditions]
        base = next((o for o in alike if (o.strategy, o.nodes, o.precision) ==
                     (BASELINE_STRATEGY, 1, BASELINE_PRECISION)), None)
        if base is cell:
            cell.is_baseline = True
        elif base is not None:
            cell.speedup = stats.ratio_effect(cell.values(), base.values())
        ones = [o for o in alike if o.nodes == 1 and (o.strategy, o.precision) ==
                (cell.strategy, cell.precision)]
        exact = [o for o in ones if o.world_size == (cell.world_size or 0) // (cell.nodes or 1)]
        ref = (exact or ones or [None])[0]
        if ref is not None and cell.nodes and cell.nodes > 1:
            effect, n = stats.ratio_effect(cell.values(), ref.values()), cell.nodes
            iv = effect.interval
            cell.scaling = stats.Effect(effect.ratio / n, stats.Interval(
                iv.low / n, iv.high / n, iv.level, iv.attained))


def _verdict_units(cells: list[Cell]) -> list[tuple[int, int | None, list[Cell]]]:
    """(group, nodes, cells) in table order: one verdict each."""
    keys = dict.fromkeys((c.group, c.nodes) for c in cells)
    return [(g, n, [c for c in cells if (c.group, c.nodes) == (g, n)]) for g, n in keys]


NETWORK_DRIFT = 0.3
"""A multi-node probe whose bus bandwidth at its largest size moved more than this between a
campaign's start and its end: the network changed under the campaign (a link slowed, another
job's traffic), and its multi-node cells ran on different networks. Above the noise of a link
that did not change (0-5% on the local cluster's shaped links, up to 25% on its unshaped
loopback); a link slowed to a quarter moves it -75%."""


def network_changes(baseline: list[dict]) -> dict[str, str]:
    """Campaign -> how its network changed, where a multi-node probe drifted beyond
    NETWORK_DRIFT from its start to its end."""
    pairs: dict[tuple, dict] = {}
    for b in baseline:
        if int(b.get("nodes") or 1) > 1:
            key = (str(b.get("campaign") or ""), str(b.get("communication")), b.get("nodes"),
                   b.get("world_size"))
            pairs.setdefault(key, {})[b.get("when") or "start"] = b
    changed: dict[str, str] = {}
    for (campaign, communication, nodes, _), pair in sorted(pairs.items(), key=str):
        if "start" not in pair or "end" not in pair or not _sweep(pair["start"]):
            continue
        start = _sweep(pair["start"])[-1]
        end = next((e for e in _sweep(pair["end"]) if e["bytes"] == start["bytes"]), None)
        drift = end["busbw_GBps"] / start["busbw_GBps"] - 1 if end else 0.0
        if abs(drift) > NETWORK_DRIFT and campaign not in changed:
            changed[campaign] = (f"the network changed during the campaign: {communication} "
                                 f"busbw on {nodes} nodes {drift:+.0%} at its end against its "
                                 "start")
    return changed


def verdicts(cells: list[Cell], network: dict[str, str] | None = None) -> list[dict]:
    """Per comparison group (one source) and node count: stats.decide over its cells, one
    decision per set of conditions, and a refusal line where the cells differ in them.
    network: network_changes(baseline); a campaign whose network changed gets no call across
    nodes (its cells ran on different networks, in the order they ran)."""
    out = []
    for _group, nodes, same in _verdict_units(cells):
        first = same[0]
        by_conditions: dict[tuple, list[Cell]] = {}
        for c in same:
            by_conditions.setdefault(c.conditions, []).append(c)
        base = {"source": first.source, "experiment": first.experiment, "nodes": nodes}
        if len(by_conditions) > 1:
            sets = "; ".join(f"{', '.join(c.name for c in group)}: {describe_conditions(k)}"
                             for k, group in by_conditions.items())
            out.append({**base, "outcome": "refused", "fastest": None, "conditions": None,
                        "text": f"no verdict across the cells on {nodes} node(s): they ran "
                                f"under different conditions ({sets}); each set is judged on "
                                "its own. Give every cell one train.malloc, thread count and "
                                "container (hpcdp compare does)"})
        for conditions, group in by_conditions.items():
            band = next((r.equivalent_within for c in group for r in c.runs
                         if r.equivalent_within is not None), stats.EQUIVALENT_WITHIN)
            v = stats.decide({c.name: c.values() for c in group}, nodes or 1,
                             equivalent_within=band,
                             excluded={c.name: c.loss_failure for c in group if c.loss_failure},
                             unsettled={c.name: _unsettled_summary(c) for c in group
                                        if c.unsettled})
            outcome, text = v.outcome, v.text
            changed = (network or {}).get(first.source) if (nodes or 1) > 1 else None
            if changed:  # no cell wins on the network it happened to run on
                outcome = "undecided" if v.outcome in ("faster", "equivalent") else v.outcome
                text = f"no call on {nodes} node(s): {changed}; as measured: {v.text}"
                for cell in group:
                    cell.vs_fastest = "no call: network changed"
            else:
                _mark(group, v)
            trades = memory_trades(group, v.fastest)
            text += f"; memory: {'; '.join(trades)}" if trades else ""
            out.append({**base, "outcome": outcome, "fastest": v.fastest,
                        "conditions": dict(zip(CONDITIONS, conditions)),
                        "needed_repeats": v.needed_repeats, "text": text,
                        "memory_trades": trades,
                        "comparisons": [_comparison(c) for c in v.comparisons]})
    return out


MEMORY_TRADE_BELOW = 0.9
"""A cell whose memory per rank is under this share of its reference's trades speed for
memory: the verdict names it (the reason to shard: docs/compare.md)."""


def _memory_reference(cell: Cell, group: list[Cell], lead: Cell | None) -> Cell | None:
    """The unsharded strategy the cell shards (the registry's shards_state_of: fsdp against
    DDP) in the same precision, transport and world, where the group has it, else the
    throughput leader: a bf16 DDP cell holds half of fp32's state, so against it an fp32 fsdp
    cell's sharding would look like nothing (issue 36, item 10)."""
    spec = registry.find(cell.strategy) if cell.strategy else None
    alike = [o for o in group if spec and o.strategy == spec.shards_state_of
             and not o.loss_failure and (o.precision, o.communication, o.world_size)
             == (cell.precision, cell.communication, cell.world_size)]
    return alike[0] if alike else lead


def memory_trades(group: list[Cell], leader: str | None) -> list[str]:
    """'fsdp 2n: 0.55x distributed-ps 2n's memory per rank (state 0.50x) at 0.93x its
    throughput (0.92x-0.94x)', for each cell that holds clearly less per rank than its
    reference (_memory_reference; medians of the runs, the throughput ratio with its 95%
    interval, as the table's speed-up). A cell that failed loss parity is no trade: it trained
    other maths."""
    lead = next((c for c in group if c.name == leader), None)
    trades = []
    for c in group:
        ref = _memory_reference(c, group, lead)
        if (ref is None or c is ref or c.loss_failure or not ref.memory_gb or not ref.median
                or c.memory_gb is None or c.memory_gb >= MEMORY_TRADE_BELOW * ref.memory_gb):
            continue
        state = (f" (state {c.state_gb / ref.state_gb:.2f}x)"
                 if c.state_gb is not None and ref.state_gb else "")
        speed = stats.ratio_effect(c.values(), ref.values())
        span = speed.interval.text(lambda v: f"{v:.2f}x")
        trades.append(f"{c.name}: {c.memory_gb / ref.memory_gb:.2f}x {ref.name}'s memory per "
                      f"rank{state} at {speed.ratio:.2f}x its throughput ({span})")
    return trades


def _comparison(c: stats.Comparison) -> dict:
    return {"other": c.other, "p": c.p, "p_adjusted": c.p_adjusted, "outcome": c.outcome,
            "ratio": c.effect.ratio, "interval": _interval(c.effect.interval)}


def _mark(group: list[Cell], v: stats.Verdict) -> None:
    """Each cell's word against the leader, with its gap, for the table's last column."""
    words = {"faster": "slower", "equivalent": "equally fast", "undecided": "can't tell"}
    by_name = {c.other: c for c in v.comparisons}
    for cell in group:
        if cell.name == v.fastest:
            cell.vs_fastest = "leader" if v.comparisons else "-"
        elif cell.name in by_name:
            c = by_name[cell.name]
            cell.vs_fastest = f"{words[c.outcome]} ({1.0 / c.effect.ratio - 1.0:+.1%})"


def has_repeats(cells: list[Cell]) -> bool:
    return any(len(c.runs) > 1 for c in cells)


COLUMNS = ("cell", "runs", "tokens/s median", "95% interval", "speed-up", "scaling eff",
           "exposed comm", "all-reduce / step", "bandwidth reached", "mem/rank GB",
           "state/rank GB", "vs leader")


def _effect_text(effect: stats.Effect | None, percent: bool, exact: bool = False) -> str:
    fmt = (lambda v: f"{100 * v:.1f}%") if percent else (lambda v: f"{v:.2f}x")
    if exact:
        return fmt(1.0)
    if effect is None:
        return "-"
    iv = effect.interval
    if iv.attained:
        return f"{fmt(effect.ratio)} [{fmt(iv.low)}, {fmt(iv.high)}]"
    return f"{fmt(effect.ratio)} (range {fmt(iv.low)}-{fmt(iv.high)})"


def _row(c: Cell) -> list[str]:
    runs = str(len(c.runs)) + (f" ({c.failed} failed)" if c.failed else "") + \
        (" *" if c.unsettled else "")
    return [c.name, runs, f"{c.median:,.0f}", c.interval.text(),
            _effect_text(c.speedup, percent=False, exact=c.is_baseline),
            _effect_text(c.scaling, percent=True),
            "-" if c.exposed_share is None else f"{100 * c.exposed_share:.0f}%",
            "-" if c.allreduce_share is None else
            f"{c.allreduce_s * 1e3:.1f} ms = {100 * c.allreduce_share:.0f}%",
            "-" if c.bandwidth_reached is None else f"{100 * c.bandwidth_reached:.0f}%",
            "-" if c.memory_gb is None else f"{c.memory_gb:.2f}",
            "-" if c.state_gb is None else f"{c.state_gb:.2f}",
            c.vs_fastest or "-"]


CELL_PRIORITY = (0, 1, 2, 3, 11, 4, 5, 9, 10, 6, 7, 8)
"""COLUMNS by importance, for a narrow terminal: cell, runs, median, interval, vs leader,
speed-up, scaling, memory; the communication columns last."""


def _grid(rows: list[list[str]], markdown: bool, width: int | None = None,
          priority: tuple[int, ...] | None = None) -> list[str]:
    """Rows as a markdown table or aligned text (first and last column left, others right),
    within `width` the columns that fit by `priority` (layout.fit)."""
    n = len(rows[0])
    if markdown:
        return (["| " + " | ".join(rows[0]) + " |", "|---|" + "---:|" * (n - 2) + "---|"]
                + ["| " + " | ".join(row) + " |" for row in rows[1:]])
    return layout.fit(rows, width, left={0, n - 1},
                      priority=list(priority) if priority else None)


BASELINE_COLUMNS = ("transport", "nodes", "world", "size", "", "median ms", "algbw GB/s",
                    "busbw GB/s")
END_COLUMNS = ("end busbw GB/s", "drift")


def _size(nbytes: float) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / 1024:.1f} KiB"


def render_baseline(baseline: list[dict], markdown: bool = False,
                    width: int | None = None) -> str:
    """The network baseline: per campaign, transport and world, every message size of the
    probe at the campaign's start and, where it ran, at its end (their busbw's drift)."""
    probes: dict[tuple, dict] = {}
    for b in baseline:
        key = (str(b.get("campaign") or ""), str(b.get("communication")), b.get("world_size") or 0)
        probes.setdefault(key, {})[b.get("when") or "start"] = b
    with_end = any("end" in p and "start" in p for p in probes.values())
    header = list(BASELINE_COLUMNS) + (list(END_COLUMNS) if with_end else [])
    lines: list[str] = []
    campaigns = list(dict.fromkeys(k[0] for k in sorted(probes)))
    for campaign in campaigns:
        rows = [header]
        for key in sorted(k for k in probes if k[0] == campaign):
            pair = probes[key]
            first = pair.get("start") or pair["end"]
            ends = {e["bytes"]: e for e in _sweep(pair["end"])} if "start" in pair and \
                "end" in pair else {}
            for e in _sweep(first):
                row = [key[1], str(first.get("nodes")), str(key[2]), _size(e["bytes"]),
                       str(e.get("what") or ("gradient" if e is first else "")),
                       f"{e['median_s'] * 1e3:.2f}", f"{e['algbw_GBps']:.3f}",
                       f"{e['busbw_GBps']:.3f}"]
                if with_end:
                    end = ends.get(e["bytes"])
                    row += ["-", "-"] if end is None else [
                        f"{end['busbw_GBps']:.3f}",
                        f"{100 * (end['busbw_GBps'] / e['busbw_GBps'] - 1):+.1f}%"]
                if "start" not in pair:
                    row[4] = (row[4] + " (end only)").strip()
                rows.append(row)
        if len(campaigns) > 1:
            lines += ["", f"{campaign or 'outside a campaign'}:"]
        lines += ["", *_grid(rows, markdown, width)]
    title = ("Network baseline (all-reduce per message size: median of the timed iterations, "
             "each the slowest rank's; busbw = algbw x 2(n-1)/n as nccl-tests"
             + ("; drift: end of the campaign against its start" if with_end else "") + "):")
    return "\n".join([title, *lines])


def source_label(source: str, campaign: dict | None = None) -> str:
    """How a source is named above its table."""
    if not source:
        return ("separate jobs (hpcdp submit, sbatch): each measured beside whatever else ran "
                "then; never pooled with a campaign")
    campaign = campaign or {}
    exclusive = campaign.get("exclusive")
    how = ("nodes exclusive" if exclusive else
           "nodes NOT exclusive: other jobs may have shared them" if exclusive is False else
           "exclusive not recorded")
    malloc = campaign.get("malloc")
    return f"campaign {_shown(source)} ({how}{f', malloc {malloc}' if malloc else ''})"


def _shown(source: str) -> str:
    """A campaign folder as the user typed it, where it is under the cwd."""
    shown = os.path.relpath(source)
    return source if shown.startswith("..") else shown


VERDICT_LEGEND = ("Verdict (each gap: the leader's median over the other cell's, with its "
                  "interval; the intervals of all pairs hold together with 95% confidence, a "
                  "'range' where too few runs allow that; how: docs/compare.md):")


def render_text(cells: list[Cell], markdown: bool = False,
                campaigns: dict[str, dict] | None = None,
                decided: list[dict] | None = None, width: int | None = None) -> str:
    """Per source: the per-cell table and its verdict lines (decided: verdicts(cells), which
    also fills each cell's vs_fastest); within `width`, the columns that fit."""
    campaigns = campaigns or {}
    decided = verdicts(cells) if decided is None else decided
    sources = list(dict.fromkeys(c.source for c in cells))
    lines = ["Per cell, over runs: steady tokens per step-second (what the verdict uses); the "
             "95% interval of the median, or the range where too few runs allow one (6 for a "
             "median, 4 per side for a ratio); speed-up and scaling as Hodges-Lehmann ratios "
             "with exact 95% intervals; * a run that did not settle."]
    if len(sources) > 1:
        names = ["separate jobs" if not s else f"campaign {_shown(s)}" for s in sources]
        lines += ["", f"{len(sources)} sources here, each shown and judged on its own (never "
                      "pooled): " + "; ".join(names)]
    for source in sources:
        mine = [c for c in cells if c.source == source]
        lines += ["", f"Source: {source_label(source, campaigns.get(source))}", ""]
        lines += _grid([list(COLUMNS)] + [_row(c) for c in mine], markdown, width,
                       CELL_PRIORITY)
        lines += ["", VERDICT_LEGEND] + [f"- {v['text']}" for v in decided
                                         if v["source"] == source]
    return "\n".join(lines)
