"""Repeated cells (`hpcdp compare`): each (strategy, nodes) cell's runs reduced to a median with
a 95% interval, speed-up and scaling efficiency with intervals, ties, and a verdict per node
count. The per-run table stays as it is; this is the summary under it.

Only finished runs with a throughput count, and only runs trained alike (one comparison group,
as in table.fill_comparisons) are pooled into one cell. Intervals come from stats.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcdp.harvest import stats
from hpcdp.harvest.table import (
    BASELINE_PRECISION,
    BASELINE_STRATEGY,
    FINISHED_STATES,
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
    runs: list[RunResult] = field(repr=False)
    tokens: stats.CellStats | None = None
    speedup: float | None = None
    speedup_ci95: tuple[float, float] | None = None
    scaling_efficiency: float | None = None
    scaling_efficiency_ci95: tuple[float, float] | None = None
    tie_with: list[str] = field(default_factory=list)
    allreduce_s: float | None = None
    """The network baseline's median time for one gradient all-reduce on this transport and
    world (hpcdp compare), where it was measured."""
    allreduce_share: float | None = None
    """allreduce_s / this cell's median step time: the share of a step one un-overlapped
    gradient all-reduce would take (communication that backward hides does not count)."""
    bandwidth_reached: float | None = None
    """The baseline's all-reduce time / this cell's own all-reduce time in training: the share
    of the measured bandwidth training reaches (DDP, whose reducer times it)."""
    exposed_share: float | None = None
    """Median exposed gradient communication / median step time, over its runs."""
    group: int = 0
    """Index of its comparison group: cells are compared only within one."""
    name: str = ""
    """e.g. "horovod 2n"; with tasks per node and transport where two cells would share it."""

    def short_name(self) -> str:
        precision = "" if self.precision in (None, BASELINE_PRECISION) else f" {self.precision}"
        return f"{self.strategy}{precision} {self.nodes}n"

    def long_name(self) -> str:
        tasks = (self.world_size or 0) // (self.nodes or 1)
        return f"{self.short_name()} x{tasks} {self.communication or '-'}"

    def values(self) -> list[float]:
        return [r.tokens_per_s for r in self.runs if r.tokens_per_s is not None]

    def to_dict(self) -> dict:
        t = self.tokens
        return {"cell": self.name, "experiment": self.experiment, "strategy": self.strategy,
                "nodes": self.nodes, "world_size": self.world_size, "precision": self.precision,
                "communication": self.communication, "repeats": t.repeats if t else 0,
                "tokens_per_s_median": t.median if t else None,
                "tokens_per_s_ci95": [t.low, t.high] if t else None,
                "tokens_per_s_range": [t.minimum, t.maximum] if t else None,
                "speedup": self.speedup, "speedup_ci95": _pair(self.speedup_ci95),
                "scaling_efficiency": self.scaling_efficiency,
                "scaling_efficiency_ci95": _pair(self.scaling_efficiency_ci95),
                "tie_with": self.tie_with, "allreduce_s": self.allreduce_s,
                "allreduce_share_of_step": self.allreduce_share,
                "exposed_comm_share_of_step": self.exposed_share,
                "bandwidth_reached": self.bandwidth_reached,
                "runs": [r.run_dir for r in self.runs]}


def _pair(interval: tuple[float, float] | None) -> list[float] | None:
    return list(interval) if interval else None


def cells_of(results: list[RunResult]) -> list[Cell]:
    """One Cell per (strategy, nodes, world, precision, communication) of each comparison
    group, from its finished runs; in the per-run table's order."""
    out: list[Cell] = []
    for index, group in enumerate(comparison_groups(results)):
        by_key: dict[tuple, Cell] = {}
        for r in group:
            if r.state not in FINISHED_STATES or r.tokens_per_s is None:
                continue
            key = (r.strategy, r.nodes, r.world_size, r.precision, r.communication)
            by_key.setdefault(key, Cell(r.experiment, *key, runs=[], group=index)).runs.append(r)
        cells = list(by_key.values())
        for cell in cells:
            cell.exposed_share = _exposed_share(cell.runs)
        shorts = [c.short_name() for c in cells]
        for cell in cells:
            cell.name = (cell.short_name() if shorts.count(cell.short_name()) == 1
                         else cell.long_name())
            cell.tokens = stats.summarize(cell.name, cell.values())
        _fill_ratios(cells)
        _fill_ties(cells)
        out.extend(cells)
    return out


def _exposed_share(runs: list[RunResult]) -> float | None:
    pairs = [(r.exposed_comm_s, r.step_time_s) for r in runs
             if r.exposed_comm_s is not None and r.step_time_s]
    if not pairs:
        return None
    return stats.median([e for e, _ in pairs]) / stats.median([s for _, s in pairs])


def attach_baseline(cells: list[Cell], baseline: list[dict]) -> None:
    """Each distributed cell's all-reduce time from the probe of its transport and world."""
    probes = {(b.get("communication") or "", b.get("world_size")): b for b in baseline}
    for cell in cells:
        comm = (cell.communication or "").split("/")[0]
        probe = probes.get((comm, cell.world_size))
        steps = [r.step_time_s for r in cell.runs if r.step_time_s]
        if probe and isinstance(probe.get("median_s"), (int, float)):
            cell.allreduce_s = float(probe["median_s"])
            if steps:
                cell.allreduce_share = cell.allreduce_s / stats.median(steps)
            own = [r.allreduce_s for r in cell.runs if r.allreduce_s]
            if own:
                cell.bandwidth_reached = cell.allreduce_s / stats.median(own)


def _fill_ratios(cells: list[Cell]) -> None:
    """Speed-up against single-gpu fp32 on 1 node; scaling efficiency against the same
    strategy and precision on 1 node (same tasks per node where there is such a cell)."""
    base = next((c for c in cells if (c.strategy, c.nodes, c.precision) ==
                 (BASELINE_STRATEGY, 1, BASELINE_PRECISION)), None)
    for cell in cells:
        if base is not None:
            cell.speedup = cell.tokens.median / base.tokens.median
            cell.speedup_ci95 = stats.ratio_ci(cell.values(), base.values())
        alike = [o for o in cells if o.nodes == 1 and (o.strategy, o.precision) ==
                 (cell.strategy, cell.precision)]
        exact = [o for o in alike if o.world_size == (cell.world_size or 0) // (cell.nodes or 1)]
        ref = (exact or alike or [None])[0]
        if ref is not None and cell.nodes and cell.nodes > 1:
            n = cell.nodes
            cell.scaling_efficiency = cell.tokens.median / (n * ref.tokens.median)
            low, high = stats.ratio_ci(cell.values(), ref.values())
            cell.scaling_efficiency_ci95 = (low / n, high / n)


def _fill_ties(cells: list[Cell]) -> None:
    """Ties among the cells of one node count: their intervals overlap."""
    for nodes in {c.nodes for c in cells}:
        same = [c for c in cells if c.nodes == nodes]
        tied = stats.ties([c.tokens for c in same])
        for cell in same:
            cell.tie_with = tied[cell.name]


def verdicts(cells: list[Cell]) -> list[dict]:
    """Per comparison group and node count: the fastest cell, its margin, whether it is
    decisive."""
    out = []
    for group, experiment, nodes in dict.fromkeys((c.group, c.experiment, c.nodes)
                                                  for c in cells):
        same = [c.tokens for c in cells if (c.group, c.nodes) == (group, nodes)]
        v = stats.verdict(same, nodes or 1)
        out.append({"experiment": experiment, "nodes": nodes, "fastest": v.fastest,
                    "runner_up": v.runner_up, "margin": v.margin, "decisive": v.decisive,
                    "text": v.text})
    return out


def has_repeats(cells: list[Cell]) -> bool:
    return any(c.tokens and c.tokens.repeats > 1 for c in cells)


COLUMNS = ("cell", "repeats", "tokens/s median", "95% interval", "min-max", "speed-up",
           "scaling eff", "exposed comm", "all-reduce / step", "bandwidth reached", "ties with")


def _row(c: Cell) -> list[str]:
    t = c.tokens

    def ratio(value, interval, percent):
        if value is None:
            return "-"
        fmt = (lambda v: f"{100 * v:.1f}%") if percent else (lambda v: f"{v:.2f}x")
        return f"{fmt(value)} [{fmt(interval[0])}, {fmt(interval[1])}]"

    return [c.name, str(t.repeats), f"{t.median:,.0f}", f"{t.low:,.0f}-{t.high:,.0f}",
            f"{t.minimum:,.0f}-{t.maximum:,.0f}",
            ratio(c.speedup, c.speedup_ci95, percent=False),
            ratio(c.scaling_efficiency, c.scaling_efficiency_ci95, percent=True),
            "-" if c.exposed_share is None else f"{100 * c.exposed_share:.0f}%",
            "-" if c.allreduce_share is None else
            f"{c.allreduce_s * 1e3:.1f} ms = {100 * c.allreduce_share:.0f}%",
            "-" if c.bandwidth_reached is None else f"{100 * c.bandwidth_reached:.0f}%",
            ", ".join(c.tie_with) or "-"]


def _grid(rows: list[list[str]], markdown: bool) -> list[str]:
    """Rows as a markdown table or aligned text (first and last column left, others right)."""
    n = len(rows[0])
    if markdown:
        return (["| " + " | ".join(rows[0]) + " |", "|---|" + "---:|" * (n - 2) + "---|"]
                + ["| " + " | ".join(row) + " |" for row in rows[1:]])
    widths = [max(len(row[i]) for row in rows) for i in range(n)]
    return ["  ".join(cell.ljust(w) if i in (0, n - 1) else cell.rjust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]


BASELINE_COLUMNS = ("transport", "nodes", "world", "MB", "median ms", "algbw GB/s",
                    "busbw GB/s")


def render_baseline(baseline: list[dict], markdown: bool = False) -> str:
    """The campaign's network baseline: one gradient's all-reduce per transport and world."""
    rows = [list(BASELINE_COLUMNS)] + [
        [str(b.get("communication")), str(b.get("nodes")), str(b.get("world_size")),
         f"{b['bytes'] / 1e6:.1f}", f"{b['median_s'] * 1e3:.2f}", f"{b['algbw_GBps']:.3f}",
         f"{b['busbw_GBps']:.3f}"]
        for b in sorted(baseline, key=lambda b: (str(b.get("communication")),
                                                 b.get("world_size") or 0))]
    title = "Network baseline (all-reduce of one gradient, median of 10; busbw as nccl-tests):"
    return "\n".join([title, "", *_grid(rows, markdown)])


def render_text(cells: list[Cell], markdown: bool = False) -> str:
    """The per-cell table and one verdict line per node count."""
    lines = _grid([list(COLUMNS)] + [_row(c) for c in cells], markdown)
    verdict_lines = [f"- {v['text']}" for v in verdicts(cells)]
    title = "Per cell, over repeats (median tokens/s, 95% bootstrap interval):"
    return "\n".join([title, "", *lines, "", "Verdict:", *verdict_lines])
