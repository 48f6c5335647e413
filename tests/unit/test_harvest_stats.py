"""harvest/stats.py: exact, distribution-free statistics for a few runs per cell, with known
answers (issue 18): identical cells give no winner at any n, the A/B/C case is not decisive,
a real 10% difference at 8 runs is called with its p-value."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.harvest import stats

# --- median and its interval ------------------------------------------------------------------


@pytest.mark.parametrize("values,expected", [([3.0], 3.0), ([1.0, 5.0], 3.0),
                                             ([9.0, 1.0, 5.0], 5.0)])
def test_median(values, expected):
    assert stats.median(values) == expected


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [math.inf]])
def test_median_refuses_empty_and_non_finite(bad):
    with pytest.raises(ValueError):
        stats.median(bad)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_below_six_runs_the_median_interval_is_the_range_and_says_its_confidence(n):
    iv = stats.median_interval([float(v) for v in range(n)])
    assert (iv.low, iv.high, iv.attained) == (0.0, n - 1.0, False)
    assert iv.level == pytest.approx(1 - 2 * 0.5 ** n)  # 50% at 2 runs, 75% at 3
    assert iv.text().startswith("range ")


def test_six_runs_reach_a_95_percent_interval_of_the_median():
    iv = stats.median_interval([5.0, 1.0, 4.0, 2.0, 6.0, 3.0])
    assert (iv.low, iv.high, iv.attained) == (1.0, 6.0, True)
    assert iv.level == pytest.approx(1 - 2 / 64)


def test_more_runs_narrow_the_median_interval_to_inner_order_statistics():
    iv = stats.median_interval([float(v) for v in range(1, 21)])
    # B(20, 1/2): P(B <= 5) = 0.0207, so k = 6: [x_6, x_15], coverage 1 - 2 * 0.0207
    assert (iv.low, iv.high) == (6.0, 15.0)
    assert iv.level == pytest.approx(1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2 ** 20)


# --- the exact test ---------------------------------------------------------------------------


@pytest.mark.parametrize("n,expected", [(2, 1 / 3), (3, 0.1), (4, 2 / 70), (5, 2 / 252)])
def test_smallest_exact_p_per_run_count(n, expected):
    assert stats.min_p(n, n) == pytest.approx(expected)


def test_exact_p_of_completely_separated_runs_is_the_smallest_possible():
    assert stats.exact_p([10.0, 11.0, 12.0, 13.0], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(2 / 70)


def test_exact_p_handles_ties_by_permutation():
    p = stats.exact_p([1.0, 2.0, 2.0], [2.0, 3.0, 3.0])
    assert 0.0 < p <= 1.0
    assert stats.exact_p([5.0, 5.0], [5.0, 5.0]) == pytest.approx(1.0)


def test_needed_repeats_come_from_the_test_and_the_number_of_pairs():
    # two cells: one pair, 4 vs 4 reaches 0.029; four cells: 6 pairs, 0.05 / 6 needs 5 vs 5
    # (0.0079); six cells: 15 pairs, 0.0033 needs 6 vs 6 (0.0022); eight: 28 pairs, 7 vs 7
    assert [stats.needed_repeats(k) for k in (2, 3, 4, 5, 6, 7, 8)] == [4, 5, 5, 6, 6, 6, 7]
    assert stats.pairs(4) == 6 and stats.family_level(4) == pytest.approx(1 - 0.05 / 6)


# --- the effect: Hodges-Lehmann ratio with its exact interval --------------------------------


def test_ratio_effect_is_the_median_run_by_run_ratio_with_the_moses_interval():
    x = [110.0, 111.0, 112.0, 113.0, 114.0, 115.0, 116.0, 117.0]
    y = [100.0, 101.0, 102.0, 103.0, 104.0, 105.0, 106.0, 107.0]
    effect = stats.ratio_effect(x, y)
    ratios = sorted(a / b for a in x for b in y)
    assert effect.ratio == pytest.approx(math.exp(stats.median([math.log(r) for r in ratios])))
    assert effect.interval.attained and effect.interval.level >= 0.95
    assert ratios[0] < effect.interval.low <= effect.ratio <= effect.interval.high < ratios[-1]


def test_two_runs_a_side_give_the_range_of_ratios_at_its_own_confidence():
    effect = stats.ratio_effect([100.0, 101.0], [98.0, 99.0])
    iv = effect.interval
    assert not iv.attained and iv.level == pytest.approx(1 - 2 / 6)
    assert (iv.low, iv.high) == (pytest.approx(100 / 99), pytest.approx(101 / 98))


def test_ratio_effect_is_symmetric_on_logs():
    x, y = [120.0, 125.0, 123.0], [100.0, 98.0, 104.0]
    assert stats.ratio_effect(x, y).ratio == pytest.approx(1 / stats.ratio_effect(y, x).ratio)


def test_ratio_effect_refuses_non_positive_throughput():
    with pytest.raises(ValueError, match="positive"):
        stats.ratio_effect([1.0, 0.0], [1.0, 2.0])


# --- the verdict ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(2, 11))
def test_identical_cells_give_no_winner_at_any_n(n):
    rng = random.Random(n)
    for _ in range(40):
        cells = {name: [rng.gauss(1000.0, 30.0) for _ in range(n)] for name in "abcd"}
        assert stats.decide(cells, nodes=1).outcome != "faster"


def test_the_abc_case_is_not_decisive_over_c():
    v = stats.decide({"A": [100.0, 101.0], "B": [98.0, 99.0], "C": [90.0, 100.5]}, nodes=1)
    assert v.fastest == "A" and v.outcome == "too few repeats"
    assert "5 needed" in v.text and all(c.outcome != "faster" for c in v.comparisons)


def test_a_ten_percent_difference_at_eight_quiet_runs_is_called_with_its_p_value():
    rng = random.Random(7)
    fast = [1100.0 * (1 + rng.gauss(0, 0.005)) for _ in range(8)]
    slow = [1000.0 * (1 + rng.gauss(0, 0.005)) for _ in range(8)]
    v = stats.decide({"ddp": fast, "horovod": slow}, nodes=2)
    assert (v.fastest, v.outcome) == ("ddp", "faster")
    (c,) = v.comparisons
    assert c.p == pytest.approx(2 / math.comb(16, 8))  # completely separated, 8 vs 8
    assert c.effect.ratio == pytest.approx(1.1, rel=0.02)
    assert v.text.startswith("ddp is fastest on 2 nodes: ahead of horovod (+")


def test_quiet_runs_within_the_band_are_equivalent():
    rng = random.Random(3)
    a = [1000.0 * (1 + rng.gauss(0, 0.002)) for _ in range(6)]
    b = [1003.0 * (1 + rng.gauss(0, 0.002)) for _ in range(6)]
    v = stats.decide({"single-gpu 1n": a, "distributed-ps 1n": b}, nodes=1)
    assert v.outcome == "equivalent" and "equally fast on 1 node (within 2%" in v.text
    # the same data with no band cannot be equivalent
    assert stats.decide({"a": a, "b": b}, nodes=1, equivalent_within=0.0).outcome != \
        "equivalent"


def test_the_winner_is_tested_against_every_cell_corrected_over_every_pair():
    fast = [120.0, 121.0, 122.0, 123.0, 124.0]
    v = stats.decide({"a": fast, "b": [100.0, 101.0, 102.0, 103.0, 104.0],
                      "c": [50.0, 51.0, 52.0, 53.0, 54.0]}, nodes=1)
    assert [c.other for c in v.comparisons] == ["b", "c"]
    # three cells, three pairs: each interval at 1 - 0.05 / 3, Bonferroni's p beside it
    assert all(c.p_adjusted == pytest.approx(3 * 2 / 252) for c in v.comparisons)
    assert all(c.effect.interval.level >= 1 - 0.05 / 3 for c in v.comparisons)
    assert v.outcome == "faster" and "p=" not in v.text


def test_a_cell_that_fails_loss_parity_cannot_win_and_is_named():
    v = stats.decide({"bf16": [200.0, 201.0, 202.0, 203.0, 204.0],
                      "fp32": [100.0, 101.0, 102.0, 103.0, 104.0]}, nodes=1,
                     excluded={"bf16": "its loss drifts 5.0%"})
    assert v.fastest == "fp32" and v.outcome != "faster"
    assert "bf16 may not win: its loss drifts 5.0%" in v.text


def test_unsettled_runs_are_named_in_the_verdict():
    v = stats.decide({"a": [1.0, 2.0], "b": [1.5, 2.5]}, nodes=1,
                     unsettled={"a": "repeat-2 (step times vary 14%)"})
    assert "unsettled runs in a: repeat-2 (step times vary 14%)" in v.text


def test_one_cell_is_alone_and_bad_input_is_refused():
    assert stats.decide({"ddp": [5.0, 6.0]}, nodes=8).outcome == "alone"
    with pytest.raises(ValueError):
        stats.decide({}, nodes=1)
    with pytest.raises(ValueError):
        stats.decide({"a": [1.0]}, nodes=0)
    with pytest.raises(ValueError):
        stats.decide({"a": [1.0]}, nodes=1, equivalent_within=1.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1.0, 1e6), min_size=2, max_size=7),
       st.lists(st.floats(1.0, 1e6), min_size=2, max_size=7))
def test_properties_of_effect_and_verdict(x, y):
    effect = stats.ratio_effect(x, y)
    iv = effect.interval
    assert iv.low * (1 - 1e-9) <= effect.ratio <= iv.high * (1 + 1e-9)
    assert min(x) / max(y) * (1 - 1e-9) <= iv.low and iv.high <= max(x) / min(y) * (1 + 1e-9)
    forward = stats.decide({"x": x, "y": y}, nodes=1)
    backward = stats.decide({"y": y, "x": x}, nodes=1)
    assert (forward.fastest, forward.outcome) == (backward.fastest, backward.outcome)


# --- steady state -----------------------------------------------------------------------------


def test_steadiness_of_a_quiet_run_and_of_a_drifting_one():
    cv, drift = stats.steadiness([0.1] * 10)
    assert cv == pytest.approx(0.0) and drift == pytest.approx(0.0)
    assert stats.unsettled_reason(cv, drift) is None
    cv, drift = stats.steadiness([0.1] * 5 + [0.12] * 5)
    assert drift == pytest.approx(0.2)
    assert "second half +20% vs first" in stats.unsettled_reason(cv, drift)
    assert stats.steadiness([0.1, 0.2]) == (None, None)
