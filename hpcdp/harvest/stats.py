"""Statistics for `hpcdp compare`: strategies are measured with only a few repeats per cell (a
cell = one strategy on one node count, typically 2-5 repeats), so a bare mean would hide how
noisy each cell is and would declare winners that are really ties.

    median(values)                          the centre: robust to one slow repeat
    bootstrap_ci(values)                    percentile-bootstrap interval of that median
    ratio_ci(numerator, denominator)        interval of a ratio of medians (speed-up, scaling)
    summarize(name, values) -> CellStats    one cell: median, ci95, min, max
    ties(cells)                             which cells cannot be told apart (intervals overlap)
    verdict(cells, nodes) -> Verdict        the fastest, its margin, and whether it is decisive

Standard library only, so that the CLI imports fast. Deterministic: every random draw comes from
random.Random(seed) with a fixed default seed, so the same inputs always give the same report.

Conventions, so that a table never looks self-contradictory: every interval contains its point
estimate (the median, or the ratio of medians) and lies within the range the repeats allow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


def _checked(values: Sequence[float], what: str = "values") -> list[float]:
    """The values as floats; empty or non-finite input is a caller bug, not a statistic."""
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what} is empty: need at least one measurement")
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} must be finite numbers, got {bad[0]!r}")
    return out


def _check_params(level: float, resamples: int) -> None:
    """A level outside (0, 1) or no resamples would give a meaningless interval."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be strictly between 0 and 1, got {level!r}")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples!r}")


def _median_of(values: Sequence[float]) -> float:
    """Median without re-checking: the bootstrap calls this thousands of times."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def median(values: Sequence[float]) -> float:
    """The centre of a cell's repeats: one straggling repeat moves it far less than a mean."""
    return _median_of(_checked(values))


def _percentile_interval(estimates: list[float], level: float) -> tuple[float, float]:
    """Nearest-rank percentiles of the bootstrap estimates: always one of the estimates, so no
    interpolation can step outside the range they span."""
    ordered = sorted(estimates)
    last = len(ordered) - 1
    tail = (1.0 - level) / 2.0
    low = ordered[max(0, min(last, round(tail * last)))]
    high = ordered[max(0, min(last, round((1.0 - tail) * last)))]
    return low, high


def _contain(interval: tuple[float, float], point: float, floor: float,
             ceiling: float) -> tuple[float, float]:
    """Widen the interval to hold its point estimate and clip it to [floor, ceiling], so that
    a reported median is never outside its own interval, whatever the resampling drew."""
    low, high = interval
    low = max(floor, min(low, point))
    high = min(ceiling, max(high, point))
    return low, high


def bootstrap_ci(values: Sequence[float], level: float = DEFAULT_LEVEL,
                 resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
                 ) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median over repeats: with 2-5 repeats nothing can
    be assumed about their distribution, so resample the repeats themselves.

    One value gives (v, v); the result always lies within [min(values), max(values)] and
    contains median(values)."""
    data = _checked(values)
    _check_params(level, resamples)
    point = _median_of(data)
    if len(data) == 1 or min(data) == max(data):
        return point, point
    rng = random.Random(seed)
    n = len(data)
    estimates = [_median_of(rng.choices(data, k=n)) for _ in range(resamples)]
    return _contain(_percentile_interval(estimates, level), point, min(data), max(data))


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
             level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES,
             seed: int = DEFAULT_SEED) -> tuple[float, float]:
    """Interval of median(numerator) / median(denominator), resampling both sides
    independently (their repeats are separate runs). Used for speed-up and scaling efficiency;
    a caller wanting per-node efficiency divides by the node count itself.

    The denominator must be positive (it is a throughput). The result contains the ratio of
    medians and lies within [min(numerator) / max(denominator), max(numerator) /
    min(denominator)] when the numerator is non-negative."""
    num = _checked(numerator, "numerator")
    den = _checked(denominator, "denominator")
    _check_params(level, resamples)
    if min(den) <= 0.0:
        raise ValueError(f"denominator must be positive, got {min(den)!r}")
    point = _median_of(num) / _median_of(den)
    if (len(num) == 1 or min(num) == max(num)) and (len(den) == 1 or min(den) == max(den)):
        return point, point
    rng = random.Random(seed)
    estimates = []
    for _ in range(resamples):
        top = _median_of(rng.choices(num, k=len(num)))
        bottom = _median_of(rng.choices(den, k=len(den)))
        estimates.append(top / bottom)
    corners = [a / b for a in (min(num), max(num)) for b in (min(den), max(den))]
    return _contain(_percentile_interval(estimates, level), point, min(corners), max(corners))


@dataclass(frozen=True)
class CellStats:
    """One cell (a strategy on one node count): its repeats reduced to what the table shows.
    low/high are the 95% bootstrap interval of the median."""

    name: str
    repeats: int
    median: float
    low: float
    high: float
    minimum: float
    maximum: float


def summarize(name: str, values: Sequence[float], seed: int = DEFAULT_SEED) -> CellStats:
    """One cell's repeats as a CellStats: the median with its 95% interval and the raw range,
    so a reader sees both the estimate and how far the repeats actually spread."""
    data = _checked(values, f"values of {name!r}")
    low, high = bootstrap_ci(data, level=DEFAULT_LEVEL, seed=seed)
    return CellStats(name=name, repeats=len(data), median=_median_of(data), low=low,
                     high=high, minimum=min(data), maximum=max(data))


def _overlap(a: CellStats, b: CellStats) -> bool:
    """Closed-interval overlap: touching endpoints count, erring on the side of 'a tie'."""
    return a.low <= b.high and b.low <= a.high


def _unique_names(cells: Sequence[CellStats]) -> None:
    """Cells are keyed by name; two cells with one name would silently merge."""
    seen: set[str] = set()
    for cell in cells:
        if cell.name in seen:
            raise ValueError(f"duplicate cell name {cell.name!r}")
        seen.add(cell.name)


def ties(cells: Sequence[CellStats]) -> dict[str, list[str]]:
    """For every cell, the other cells it cannot be told apart from (their 95% intervals
    overlap), sorted by name; a cell with no ties maps to []. Keys are in name order too."""
    _unique_names(cells)
    ordered = sorted(cells, key=lambda c: c.name)
    return {cell.name: [other.name for other in ordered
                        if other.name != cell.name and _overlap(cell, other)]
            for cell in ordered}


@dataclass(frozen=True)
class Verdict:
    """The headline of one node count: who is fastest, by how much, and whether the margin is
    larger than the noise (decisive) or not (a tie)."""

    fastest: str
    runner_up: str | None
    margin: float
    decisive: bool
    text: str


def _nodes_phrase(nodes: int) -> str:
    """'1 node' / '2 nodes': the verdict is a sentence a person reads."""
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def verdict(cells: Sequence[CellStats], nodes: int) -> Verdict:
    """The fastest cell (highest median: tokens/s, higher is better) against the runner-up.
    margin = fastest.median / runner_up.median - 1 (0.0 when alone); decisive only when the
    fastest's interval low is above the runner-up's interval high. Equal medians are ordered
    by name, so the answer does not depend on the input order."""
    if not cells:
        raise ValueError("no cells to compare")
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes!r}")
    _unique_names(cells)
    ranked = sorted(cells, key=lambda c: (-c.median, c.name))
    best, where = ranked[0], _nodes_phrase(nodes)
    if len(ranked) == 1:
        return Verdict(fastest=best.name, runner_up=None, margin=0.0, decisive=False,
                       text=f"{best.name} is the only strategy measured on {where}: "
                            "nothing to compare")
    second = ranked[1]
    if second.median <= 0.0:
        raise ValueError(f"medians must be positive to compare, {second.name!r} has "
                         f"{second.median!r}")
    margin = best.median / second.median - 1.0
    decisive = best.low > second.high
    tail = ("the margin exceeds the spread" if decisive
            else "the margin is within the spread: a tie")
    text = (f"{best.name} is fastest on {where}, {margin:.1%} ahead of {second.name}; "
            f"{tail}")
    return Verdict(fastest=best.name, runner_up=second.name, margin=margin,
                   decisive=decisive, text=text)
