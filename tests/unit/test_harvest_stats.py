"""hpcdp.harvest.stats on repeats with a KNOWN spread: medians, bootstrap intervals of the
median, ratio intervals, ties and the verdict sentence. Standard-library statistics, so every
expected value here is either computed by hand or a guaranteed property of the method."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.harvest import stats
from hpcdp.harvest.stats import CellStats

TIGHT = [1000.0, 1001.0, 999.0, 1000.5, 999.5]
WIDE = [800.0, 1200.0, 1000.0, 900.0, 1100.0]


def cell(name: str, values: list[float]) -> CellStats:
    return stats.summarize(name, values)


# --- median ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("values", "expected"), [
    ([5.0], 5.0),
    ([3.0, 1.0, 2.0], 2.0),                 # odd: the middle one, order does not matter
    ([4.0, 1.0, 3.0, 2.0], 2.5),            # even: the mean of the middle two
    ([10.0, 10.0, 1000.0], 10.0),           # one straggler does not move it
    ([1, 2], 1.5),                          # ints accepted, float out
])
def test_median_of_odd_and_even_counts(values: list[float], expected: float) -> None:
    assert stats.median(values) == expected


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_median_rejects_empty_and_non_finite(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        stats.median(bad)


# --- bootstrap_ci ---------------------------------------------------------------------------

def test_one_value_gives_a_point_interval() -> None:
    assert stats.bootstrap_ci([123.0]) == (123.0, 123.0)


def test_identical_repeats_give_a_point_interval() -> None:
    assert stats.bootstrap_ci([7.0, 7.0, 7.0, 7.0]) == (7.0, 7.0)


@pytest.mark.parametrize("values", [TIGHT, WIDE, [1.0, 2.0], [1.0, 2.0, 100.0],
                                    [5.0, 1.0, 3.0, 2.0, 4.0, 9.0]])
def test_interval_contains_the_median_and_lies_within_the_range(values: list[float]) -> None:
    low, high = stats.bootstrap_ci(values)
    assert min(values) <= low <= stats.median(values) <= high <= max(values)


def test_interval_is_widened_to_hold_the_median_whatever_the_draw() -> None:
    # One resample: the raw percentile interval is a single bootstrap median, often not the
    # sample median; the reported interval must still contain it (and stay within the range).
    values = [1.0, 2.0, 3.0, 50.0, 100.0]
    raw_misses = 0
    for seed in range(20):
        low, high = stats.bootstrap_ci(values, resamples=1, seed=seed)
        assert 1.0 <= low <= 3.0 <= high <= 100.0
        raw_misses += low != high
    assert raw_misses > 0   # the draw really did land off the median for some seeds


def test_three_repeats_interval_spans_the_repeats() -> None:
    # With 3 repeats the bootstrap median is the smallest repeat with probability 7/27 (far
    # above 2.5%), likewise the largest: the 95% interval is the full range.
    assert stats.bootstrap_ci([100.0, 101.0, 102.0]) == (100.0, 102.0)


def test_tight_cell_has_a_narrower_interval_than_a_wide_one() -> None:
    tight_low, tight_high = stats.bootstrap_ci(TIGHT)
    wide_low, wide_high = stats.bootstrap_ci(WIDE)
    assert tight_high - tight_low < wide_high - wide_low
    assert tight_high - tight_low <= max(TIGHT) - min(TIGHT)


def test_lower_level_gives_a_narrower_or_equal_interval() -> None:
    values = [float(v) for v in range(1, 12)]
    low95, high95 = stats.bootstrap_ci(values, level=0.95)
    low50, high50 = stats.bootstrap_ci(values, level=0.50)
    assert low95 <= low50 and high50 <= high95
    assert high50 - low50 < high95 - low95


def test_same_seed_same_answer() -> None:
    values = [float(v) for v in (3, 9, 4, 1, 7, 8)]
    first = stats.bootstrap_ci(values, seed=42)
    assert stats.bootstrap_ci(values, seed=42) == first
    assert stats.bootstrap_ci(list(values), seed=42) == first
    assert stats.bootstrap_ci(values) == stats.bootstrap_ci(values, seed=0)


def test_different_seeds_draw_different_resamples() -> None:
    values = [float(v) for v in range(20)]
    answers = {stats.bootstrap_ci(values, level=0.5, resamples=50, seed=s) for s in range(10)}
    assert len(answers) > 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"level": 0.0}, "level"), ({"level": 1.0}, "level"), ({"resamples": 0}, "resamples"),
])
def test_bootstrap_rejects_bad_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stats.bootstrap_ci([1.0, 2.0, 3.0], **kwargs)


def test_bootstrap_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty"):
        stats.bootstrap_ci([])


# --- ratio_ci -------------------------------------------------------------------------------

def test_constant_sides_give_the_exact_ratio() -> None:
    assert stats.ratio_ci([200.0, 200.0, 200.0], [100.0, 100.0, 100.0]) == (2.0, 2.0)


def test_ratio_interval_brackets_the_ratio_of_medians() -> None:
    two_nodes = [1900.0, 2000.0, 2100.0, 1950.0]
    one_node = [1000.0, 1010.0, 990.0]
    low, high = stats.ratio_ci(two_nodes, one_node)
    point = stats.median(two_nodes) / stats.median(one_node)
    assert low <= point <= high
    assert min(two_nodes) / max(one_node) <= low and high <= max(two_nodes) / min(one_node)
    assert low < high


def test_ratio_resamples_each_side_when_only_one_varies() -> None:
    low, high = stats.ratio_ci([150.0, 200.0, 250.0], [100.0])
    assert (low, high) == (1.5, 2.5)


def test_ratio_is_deterministic() -> None:
    num, den = [5.0, 6.0, 7.0, 9.0], [2.0, 3.0, 2.5]
    assert stats.ratio_ci(num, den, seed=3) == stats.ratio_ci(num, den, seed=3)


@pytest.mark.parametrize(("num", "den"), [([], [1.0]), ([1.0], []), ([1.0], [0.0, 1.0]),
                                          ([1.0], [-2.0])])
def test_ratio_rejects_empty_and_non_positive_denominators(num: list[float],
                                                           den: list[float]) -> None:
    with pytest.raises(ValueError):
        stats.ratio_ci(num, den)


# --- summarize ------------------------------------------------------------------------------

def test_summarize_fills_every_field() -> None:
    got = stats.summarize("horovod", [102.0, 100.0, 101.0])
    assert got == CellStats(name="horovod", repeats=3, median=101.0, low=100.0, high=102.0,
                            minimum=100.0, maximum=102.0)


def test_cell_stats_is_frozen() -> None:
    got = cell("ddp", [1.0, 2.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.median = 3.0  # type: ignore[misc]


def test_summarize_rejects_empty_with_the_cell_name() -> None:
    with pytest.raises(ValueError, match="ddp"):
        stats.summarize("ddp", [])


# --- ties -----------------------------------------------------------------------------------

def test_overlapping_cells_tie_and_separated_cells_do_not() -> None:
    a = cell("a", [100.0, 101.0, 102.0])
    b = cell("b", [100.5, 101.5, 102.5])
    c = cell("c", [150.0, 151.0, 152.0])
    assert stats.ties([c, b, a]) == {"a": ["b"], "b": ["a"], "c": []}
    assert list(stats.ties([c, b, a])) == ["a", "b", "c"]


def test_touching_endpoints_count_as_a_tie() -> None:
    left = CellStats("left", 3, 1.5, 1.0, 2.0, 1.0, 2.0)
    right = CellStats("right", 3, 2.5, 2.0, 3.0, 2.0, 3.0)
    apart = CellStats("apart", 3, 3.5, 3.0 + 1e-9, 4.0, 3.0 + 1e-9, 4.0)
    assert stats.ties([left, right, apart]) == {"apart": [], "left": ["right"],
                                                "right": ["left"]}


def test_tie_lists_are_sorted_by_name() -> None:
    cells = [cell(name, [10.0, 11.0, 12.0]) for name in ("zeta", "alpha", "mid")]
    assert stats.ties(cells)["mid"] == ["alpha", "zeta"]
    assert stats.ties(cells)["zeta"] == ["alpha", "mid"]


def test_ties_of_nothing_is_empty_and_duplicates_are_refused() -> None:
    assert stats.ties([]) == {}
    with pytest.raises(ValueError, match="duplicate"):
        stats.ties([cell("x", [1.0]), cell("x", [2.0])])


# --- verdict --------------------------------------------------------------------------------

def test_decisive_verdict() -> None:
    slow = cell("distributed-ps", [1000.0, 1005.0, 995.0])
    fast = cell("horovod", [1041.0, 1046.0, 1036.0])
    got = stats.verdict([slow, fast], nodes=2)
    assert (got.fastest, got.runner_up, got.decisive) == ("horovod", "distributed-ps", True)
    assert got.margin == pytest.approx(1041.0 / 1000.0 - 1)
    assert got.text == ("horovod is fastest on 2 nodes, 4.1% ahead of distributed-ps; "
                        "the margin exceeds the spread")


def test_tie_verdict() -> None:
    a = cell("ddp", [100.0, 101.0, 102.0])
    b = cell("horovod", [100.5, 101.5, 102.5])
    got = stats.verdict([a, b], nodes=1)
    assert (got.fastest, got.runner_up, got.decisive) == ("horovod", "ddp", False)
    assert got.margin == pytest.approx(101.5 / 101.0 - 1)
    assert got.text.startswith("horovod is fastest on 1 node, 0.5% ahead of ddp")
    assert got.text.endswith("within the spread: a tie")


def test_verdict_compares_only_against_the_runner_up() -> None:
    cells = [cell("first", [200.0, 201.0, 202.0]), cell("second", [201.5, 202.5, 203.5]),
             cell("last", [10.0, 11.0, 12.0])]
    got = stats.verdict(cells, nodes=4)
    assert (got.fastest, got.runner_up, got.decisive) == ("second", "first", False)


def test_single_cell_verdict() -> None:
    got = stats.verdict([cell("ddp", [5.0, 6.0])], nodes=8)
    assert (got.fastest, got.runner_up, got.margin, got.decisive) == ("ddp", None, 0.0, False)
    assert "ddp" in got.text and "8 nodes" in got.text


def test_equal_medians_are_ordered_by_name() -> None:
    cells = [cell("b", [10.0, 10.0]), cell("a", [10.0, 10.0])]
    for order in (cells, cells[::-1]):
        got = stats.verdict(order, nodes=2)
        assert (got.fastest, got.runner_up, got.margin) == ("a", "b", 0.0)
        assert not got.decisive   # equal endpoints overlap: a tie


@pytest.mark.parametrize(("cells", "nodes"), [([], 2), ([CellStats("a", 1, 1, 1, 1, 1, 1)], 0)])
def test_verdict_rejects_empty_and_bad_node_counts(cells: list[CellStats], nodes: int) -> None:
    with pytest.raises(ValueError):
        stats.verdict(cells, nodes)


def test_verdict_rejects_a_non_positive_runner_up() -> None:
    cells = [CellStats("a", 1, 5.0, 5.0, 5.0, 5.0, 5.0), CellStats("b", 1, 0.0, 0, 0, 0, 0)]
    with pytest.raises(ValueError, match="positive"):
        stats.verdict(cells, nodes=1)


# --- properties -----------------------------------------------------------------------------

repeats = st.lists(st.floats(min_value=1e-3, max_value=1e9, allow_nan=False,
                             allow_infinity=False), min_size=1, max_size=8)
PROPERTY = settings(max_examples=50, deadline=None, derandomize=True)


@PROPERTY
@given(repeats, st.floats(min_value=0.05, max_value=0.99), st.integers(0, 2**32))
def test_interval_always_within_range_and_around_the_median(values: list[float],
                                                            level: float, seed: int) -> None:
    low, high = stats.bootstrap_ci(values, level=level, resamples=200, seed=seed)
    assert min(values) <= low <= stats.median(values) <= high <= max(values)
    assert stats.bootstrap_ci(values, level=level, resamples=200, seed=seed) == (low, high)


@PROPERTY
@given(repeats, repeats, st.integers(0, 2**32))
def test_ratio_interval_always_within_the_corner_ratios(num: list[float], den: list[float],
                                                        seed: int) -> None:
    low, high = stats.ratio_ci(num, den, resamples=200, seed=seed)
    point = stats.median(num) / stats.median(den)
    assert min(num) / max(den) <= low <= point <= high <= max(num) / min(den)
