"""Statistics for `hpcdp compare`: which strategy is fastest, from a few runs of each.

The run is the unit of evidence: steps within a run are correlated, so each run gives one
number (its steady tokens/s) and a cell (a strategy on one node count) is its runs' numbers,
typically 2-10 of them. At such n nothing may be assumed about their distribution, and what an
interval or a test can say is limited by n itself, so everything here is exact and
distribution-free, and says when n is too small to reach its level:

    median_interval(values)            order-statistic interval of the median (binomial), or the
                                       range with the confidence it actually has
    ratio_effect(x, y)                 Hodges-Lehmann ratio x/y with its exact (Moses) interval
    exact_p(x, y)                      two-sided exact Mann-Whitney p (scipy.stats)
    min_p(n_x, n_y)                    the smallest p that test can give at these sizes
    family_level(cells)                each pair's confidence, so that all pairs hold at once
    decide(cells, nodes, ...)          the verdict of one node count: the leader against every
                                       other cell, each statement corrected over every pair

scipy.stats is imported only by exact_p/min_p, so that the CLI starts fast. Calibration (false
calls and power per n, simulated through this code): bench/verdict_calibration.py, table in
docs/compare.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

LEVEL = 0.95
"""Confidence of reported intervals."""
ALPHA = 0.05
"""Family-wise error of a verdict: the chance that any statement it prints (ahead of,
equivalent; headline or partial) is wrong."""
EQUIVALENT_WITHIN = 0.02
"""Default equivalence band (compare.equivalent_within): ratios within 1 +- this are 'no
practical difference'."""


def _checked(values: Sequence[float], what: str = "values") -> list[float]:
    """The values as floats; empty or non-finite input is a caller bug, not a statistic."""
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what} is empty: need at least one measurement")
    bad = [v for v in out if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} must be finite numbers, got {bad[0]!r}")
    return out


def _positive(values: Sequence[float], what: str) -> list[float]:
    out = _checked(values, what)
    if min(out) <= 0.0:
        raise ValueError(f"{what} must be positive throughputs, got {min(out)!r}")
    return out


def _median_of(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def median(values: Sequence[float]) -> float:
    """The centre of a cell's runs: one straggling run moves it far less than a mean."""
    return _median_of(sorted(_checked(values)))


@dataclass(frozen=True)
class Interval:
    """[low, high] with the confidence it has. attained: False when n is too small for the
    level asked; the interval is then the widest one the data allow (the range) and `level` is
    its own, lower, confidence."""

    low: float
    high: float
    level: float
    attained: bool

    def text(self, fmt=lambda v: f"{v:,.0f}") -> str:
        if self.low == self.high and self.attained:
            return fmt(self.low)
        span = f"{fmt(self.low)}-{fmt(self.high)}"
        return span if self.attained else f"range {span} ({self.level:.0%})"


# --- the median of one cell -------------------------------------------------------------------

def _binomial_tail(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n


def median_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Distribution-free interval of the median: [x_(k), x_(n+1-k)] with the largest k whose
    coverage 1 - 2 P(B <= k-1), B ~ Binomial(n, 1/2), still reaches `level`. Below 6 runs no k
    does (the range covers the median with 1 - 2^(1-n): 50% at 2, 75% at 3), and it says so."""
    data = sorted(_checked(values))
    n = len(data)
    if n == 1:
        return Interval(data[0], data[0], 0.0, False)
    best = None
    for k in range(1, n // 2 + 1):
        coverage = 1.0 - 2.0 * _binomial_tail(n, k - 1)
        if coverage >= level:
            best = (k, coverage)
    if best is None:
        return Interval(data[0], data[-1], 1.0 - 2.0 * 0.5 ** n, False)
    k, coverage = best
    return Interval(data[k - 1], data[n - k], coverage, True)


# --- two cells: the exact test and the effect -------------------------------------------------

def exact_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided exact p of 'x and y come from one distribution' (Mann-Whitney, on ranks: a run
    slowed by a neighbour counts once, not by how slow). Ties: an exact permutation test of the
    same statistic, as scipy's exact method assumes none."""
    from scipy import stats as sps

    xs, ys = _checked(x, "x"), _checked(y, "y")
    # scipy's permutation test needs 2 runs a side; with one, ties only make U's exact p larger
    if len(set(xs + ys)) == len(xs) + len(ys) or min(len(xs), len(ys)) < 2:
        return float(sps.mannwhitneyu(xs, ys, alternative="two-sided", method="exact").pvalue)

    def u(a, b, axis=-1):
        return sps.mannwhitneyu(a, b, axis=axis, method="asymptotic").statistic

    result = sps.permutation_test((xs, ys), u, permutation_type="independent",
                                  alternative="two-sided", n_resamples=math.inf,
                                  vectorized=True)
    return float(min(1.0, result.pvalue))


@cache
def min_p(n_x: int, n_y: int) -> float:
    """The smallest two-sided p exact_p can return for these sizes (completely separated runs),
    taken from the test itself: 0.333 at 2 vs 2, 0.100 at 3 vs 3, 0.029 at 4 vs 4."""
    return exact_p([float(2 * n_y + i) for i in range(n_x)], [float(i) for i in range(n_y)])


@cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of orderings giving each Mann-Whitney U = 0..m*n (no ties), by the classic
    recurrence f(m, n, u) = f(m-1, n, u-n) + f(m, n-1, u)."""
    if m == 0 or n == 0:
        return (1,)
    a, b = _u_counts(m - 1, n), _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u in range(m * n + 1):
        out[u] = (a[u - n] if 0 <= u - n < len(a) else 0) + (b[u] if u < len(b) else 0)
    return tuple(out)


@dataclass(frozen=True)
class Effect:
    """x relative to y: the Hodges-Lehmann ratio (median of all run-by-run ratios) and its
    exact distribution-free interval (Moses: order statistics of those ratios)."""

    ratio: float
    interval: Interval


def ratio_effect(x: Sequence[float], y: Sequence[float], level: float = LEVEL) -> Effect:
    """On logs, so that 'x is 5% faster' and 'y is 4.8% slower' are one statement."""
    xs, ys = _positive(x, "x"), _positive(y, "y")
    diffs = sorted(math.log(a) - math.log(b) for a in xs for b in ys)
    mn = len(diffs)
    estimate = math.exp(_median_of(diffs))
    counts = _u_counts(len(xs), len(ys))
    total = sum(counts)
    # [d_(c+1), d_(mn-c)] covers the true ratio with 1 - 2 P(U <= c): the largest such c.
    chosen, below = None, 0
    for c in range((mn + 1) // 2):
        below += counts[c]
        coverage = 1.0 - 2.0 * below / total
        if coverage < level:
            break
        chosen = (c, coverage)
    if chosen is None:  # too few runs: the widest interval, with the confidence it has
        interval = Interval(math.exp(diffs[0]), math.exp(diffs[-1]),
                            1.0 - 2.0 * counts[0] / total, False)
    else:
        c, coverage = chosen
        interval = Interval(math.exp(diffs[c]), math.exp(diffs[mn - 1 - c]), coverage, True)
    return Effect(estimate, interval)


# --- the verdict of one node count ------------------------------------------------------------

def pairs(cells: int) -> int:
    """The statements a verdict could print: one per pair of cells. The leader is chosen from the
    data, so any pair could end up compared; correcting over the leader's own comparisons alone
    let identical cells read "X ahead of Y" in up to 9% of campaigns (issue 36, item 8)."""
    return max(1, cells * (cells - 1) // 2)


def family_level(cells: int, alpha: float = ALPHA) -> float:
    """Confidence of each pair's interval (Bonferroni over every pair): with probability at
    least 1 - alpha all the pairs' intervals hold at once, so every statement read off them (ahead,
    equivalent, headline or partial) is wrong in at most alpha of verdicts together."""
    return 1.0 - alpha / pairs(cells)


@dataclass(frozen=True)
class Comparison:
    """The leader against one other cell."""

    other: str
    p: float
    """Exact two-sided p of the pair (Mann-Whitney), for reference."""
    p_adjusted: float
    """min(1, p x pairs): Bonferroni over every pair, the test the interval below is dual to."""
    effect: Effect
    """leader / other: the ratio of their medians (the figure the table shows, so a leader
    never trails a cell it leads) with the pair's Moses interval at family_level."""
    outcome: str
    """'faster': the interval lies above 1 + band; 'equivalent': inside 1 +- band;
    'undecided': neither (or too few runs for an interval at that level)."""


@dataclass(frozen=True)
class Verdict:
    """The headline of one node count."""

    fastest: str
    outcome: str
    """'faster': ahead of every other cell; 'equivalent': no practical difference with any;
    'undecided': neither shown; 'too few repeats': no call was possible at these repeats;
    'alone': nothing to compare."""
    comparisons: list[Comparison]
    text: str
    needed_repeats: int | None = None
    """Runs per cell from which a call becomes possible (with this many cells)."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Cells that may not win, and why (loss parity)."""
    unsettled: dict[str, str] = field(default_factory=dict)
    """Runs whose steady state was not reached, by cell."""


def needed_repeats(cells: int, alpha: float = ALPHA, limit: int = 50) -> int | None:
    """Runs per cell from which a call is possible among `cells`: completely separated runs
    give a pair's interval the confidence 1 - min_p(n, n), and it must reach family_level."""
    for n in range(2, limit + 1):
        if min_p(n, n) <= alpha / pairs(cells):
            return n
    return None


def _nodes_phrase(nodes: int) -> str:
    return f"{nodes} node" if nodes == 1 else f"{nodes} nodes"


def _percent(ratio: float) -> str:
    return f"{ratio - 1.0:+.1%}"


def decide(cells: Mapping[str, Sequence[float]], nodes: int, *, alpha: float = ALPHA,
           equivalent_within: float = EQUIVALENT_WITHIN,
           excluded: Mapping[str, str] | None = None,
           unsettled: Mapping[str, str] | None = None) -> Verdict:
    """cells: name -> per-run tokens/s (higher is better). The eligible cell with the highest
    median leads; it is compared with every other cell through the pair's interval at
    family_level (all pairs at once hold with 1 - alpha): 'faster' where it lies above
    1 + equivalent_within, 'equivalent' where it lies inside the band. excluded: cells that may
    not win (name -> reason); unsettled: cells with unsettled runs (name -> which)."""
    if not cells:
        raise ValueError("no cells to compare")
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes!r}")
    if not 0.0 <= equivalent_within < 1.0:
        raise ValueError(f"equivalent_within must be in [0, 1), got {equivalent_within!r}")
    data = {name: _positive(values, f"runs of {name!r}") for name, values in cells.items()}
    excluded, unsettled = dict(excluded or {}), dict(unsettled or {})
    where = _nodes_phrase(nodes)
    ranked = sorted(data, key=lambda name: (-_median_of(sorted(data[name])), name))
    eligible = [name for name in ranked if name not in excluded]
    tail = "".join(f"; {n}" for n in _notes(data, ranked, excluded, unsettled))
    if not eligible:
        return Verdict(ranked[0], "undecided", [], f"no cell on {where} may win{tail}",
                       excluded=excluded, unsettled=unsettled)
    best = eligible[0]
    others = [name for name in ranked if name != best]
    if not others:
        return Verdict(best, "alone", [], f"{best} is the only strategy measured on {where}: "
                       f"nothing to compare{tail}", excluded=excluded, unsettled=unsettled)
    comparisons = _compare_all(data, best, others, alpha, equivalent_within)
    outcome, text, need = _headline(data, best, comparisons, where, alpha, equivalent_within)
    return Verdict(best, outcome, comparisons, text + tail, needed_repeats=need,
                   excluded=excluded, unsettled=unsettled)


def _notes(data: dict, ranked: list[str], excluded: dict[str, str],
           unsettled: dict[str, str]) -> list[str]:
    """What the line adds after the verdict: who may not win, whose runs did not settle."""
    notes = [f"{name} may not win: {why}" for name, why in excluded.items() if name in data]
    shaky = [name for name in ranked if name in unsettled]
    if len(shaky) == 1:
        notes.append(f"unsettled runs in {shaky[0]}: {unsettled[shaky[0]]}")
    elif shaky:  # one clause, however many cells: the verdict stays readable
        notes.append(f"unsettled runs in {len(shaky)} of {len(data)} cells, e.g. {shaky[0]}: "
                     f"{unsettled[shaky[0]]}")
    return notes


def _compare_all(data: dict[str, list[float]], best: str, others: list[str], alpha: float,
                 equivalent_within: float) -> list[Comparison]:
    """The leader against each other cell, each read off its interval at family_level."""
    level, m = family_level(len(data), alpha), pairs(len(data))
    low_band, high_band = 1.0 / (1.0 + equivalent_within), 1.0 + equivalent_within
    lead = _median_of(sorted(data[best]))
    comparisons = []
    for other in others:
        iv = ratio_effect(data[best], data[other], level=level).interval
        if iv.attained and low_band < iv.low and iv.high < high_band:
            outcome = "equivalent"
        elif iv.attained and iv.low > high_band:
            outcome = "faster"
        else:
            outcome = "undecided"
        p = exact_p(data[best], data[other])
        effect = Effect(lead / _median_of(sorted(data[other])), iv)
        comparisons.append(Comparison(other, p, min(1.0, p * m), effect, outcome))
    return comparisons


def _gap(c: Comparison) -> str:
    """'horovod 2n (+9.9%, +8.8% to +11.1%)'; where too few runs allow no interval at the
    family's level: 'range ...', the widest the runs give."""
    iv = c.effect.interval
    span = f"{_percent(iv.low)} to {_percent(iv.high)}"
    return f"{c.other} ({_percent(c.effect.ratio)}, {span if iv.attained else 'range ' + span})"


def _headline(data: dict[str, list[float]], best: str, comparisons: list[Comparison],
              where: str, alpha: float, equivalent_within: float
              ) -> tuple[str, str, int | None]:
    """(outcome, sentence, runs per cell needed for a call) from the comparisons. Every
    'faster' and 'equivalent' comparison is said, whatever the headline: each is a statement."""
    n_runs = min(len(v) for v in data.values())
    need = needed_repeats(len(data), alpha)
    band = f"{equivalent_within:.0%}"
    ahead = [c for c in comparisons if c.outcome == "faster"]
    alike = [c for c in comparisons if c.outcome == "equivalent"]
    open_ = [c for c in comparisons if c.outcome == "undecided"]
    said_ahead = "ahead of " + ", ".join(map(_gap, ahead))
    if not open_ and not alike:
        return "faster", f"{best} is fastest on {where}: {said_ahead}", need
    if not open_:
        text = (f"{best} and {', '.join(c.other for c in alike)} are equally fast on {where} "
                f"(within {band}: " + ", ".join(map(_gap, alike)) + ")")
        return "equivalent", text + (f"; {best} is {said_ahead}" if ahead else ""), need
    if not any(c.effect.interval.attained for c in comparisons):
        return "too few repeats", (
            f"too few repeats to call on {where}: {n_runs} run(s) per cell cannot tell "
            f"{len(data)} strategies apart; {need} needed (highest median: {best})"), need
    text = f"no winner on {where}: {best} has the highest median"
    if ahead:
        text += f"; {said_ahead}"
    if alike:
        text += f"; equally fast (within {band}) as " + ", ".join(map(_gap, alike))
    text += "; could not tell apart from " + ", ".join(map(_gap, open_))
    if need is not None and n_runs < need:
        text += f"; {need} runs per cell make a call possible"
    return "undecided", text, need


# --- one run's steady state -------------------------------------------------------------------

UNSETTLED_CV = 0.25
"""A run whose steady step times vary more than this (std / mean) did not settle. Steps of tens
of milliseconds on shared CPUs vary 10-15% within a quiet run here: noise the run's median
absorbs, not a run that never settled."""
UNSETTLED_DRIFT = 0.10
"""Nor one whose second half's median step differs from its first half's by more than this:
still warming up, or the machine changed under it (its median then depends on its length)."""


def steadiness(step_times: Sequence[float]) -> tuple[float | None, float | None]:
    """(coefficient of variation, drift = median(second half) / median(first half) - 1) of a
    run's steady step times; None where there are too few steps (under 4)."""
    times = [float(t) for t in step_times if t is not None and math.isfinite(t) and t > 0]
    if len(times) < 4:
        return None, None
    mean = sum(times) / len(times)
    cv = math.sqrt(sum((t - mean) ** 2 for t in times) / (len(times) - 1)) / mean
    half = len(times) // 2
    drift = _median_of(sorted(times[-half:])) / _median_of(sorted(times[:half])) - 1.0
    return cv, drift


def unsettled_reason(cv: float | None, drift: float | None) -> str | None:
    """Why a run did not reach a steady state, or None when it did (or cannot be told)."""
    reasons = []
    if cv is not None and cv > UNSETTLED_CV:
        reasons.append(f"step times vary {cv:.0%}")
    if drift is not None and abs(drift) > UNSETTLED_DRIFT:
        reasons.append(f"second half {drift:+.0%} vs first")
    return ", ".join(reasons) or None
