"""Confidence intervals and seed-paired ratios, against published Student t quantiles and hand-computed cases."""
import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.report.stats import ci_half_width, paired_ratio, ratio_interval, t_quantile


@pytest.mark.parametrize("df, quantile", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423),
                                          (200, 1.9719)])
def test_t_quantile_matches_the_tables(df, quantile):
    from tests.study_data import t_quantile as second

    assert t_quantile(df) == pytest.approx(quantile, abs=1e-4) and second(df) == pytest.approx(quantile, abs=1e-4)


def test_t_quantile_other_levels_and_bad_df():
    from tests.study_data import t_quantile as second

    assert t_quantile(5, level=0.90) == pytest.approx(2.0150, abs=1e-4) == second(5, level=0.90)
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0)


def test_ci_half_width():
    assert ci_half_width([3.0]) is None and ci_half_width([]) is None
    values = [1.0, 2.0, 4.0]
    assert ci_half_width(values) == pytest.approx(4.3027 * statistics.stdev(values) / math.sqrt(3), rel=1e-4)
    assert ci_half_width([2.0, 2.0, 2.0]) == 0.0


def test_paired_ratio_is_a_geometric_mean_with_a_log_interval():
    ratio, low, high = paired_ratio([10.0, 20.0, 40.0], [5.0, 10.0, 20.0])  # every pair exactly 2x
    assert (ratio, low, high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(2.0))
    ratio, low, high = paired_ratio([100.0, 104.0, 99.0], [101.0, 103.0, 100.0])
    assert low < 1 < high and ratio == pytest.approx((100 / 101 * 104 / 103 * 99 / 100) ** (1 / 3))
    flipped = paired_ratio([101.0, 103.0, 100.0], [100.0, 104.0, 99.0])  # the other way round: 1/x, interval too
    assert flipped[0] == pytest.approx(1 / ratio) and flipped[1] == pytest.approx(1 / high)
    assert paired_ratio([3.0], [2.0]) == (pytest.approx(1.5), None, None)
    assert ratio_interval([100 / 101, 104 / 103, 99 / 100]) == pytest.approx((ratio, low, high))  # the ratios given
    with pytest.raises(ValueError):
        ratio_interval([])
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])


@given(st.lists(st.tuples(st.floats(0.5, 2000.0), st.floats(0.5, 2000.0)), min_size=3, max_size=12))
def test_paired_ratio_agrees_with_a_second_t_interval(pairs):
    """The report's interval (its own t quantile, by bisection on the integrated density) against a second
    implementation (tests/study_data.py: the quantile from mpmath's incomplete beta function)."""
    from tests.study_data import log_interval

    base, other = [b for b, _ in pairs], [o for _, o in pairs]
    ours, second = paired_ratio(base, other), log_interval([b / o for b, o in pairs])
    assert ours == pytest.approx(second, rel=1e-9)
