"""The alpha-beta fit recovers known latency and bandwidth; bus bandwidth factors are nccl-tests'; the probe's
communicators cross one topology level each."""
import random

import pytest

from launcher.placement.alphabeta import bus_factor, fit


@pytest.mark.parametrize("alpha,rate", [(20e-6, 12.5e9), (1e-3, 1.25e7), (0.0, 1e9)])
def test_fit_recovers_alpha_and_bandwidth_from_noisy_timings(alpha, rate):
    rng = random.Random(0)
    sizes = [2 ** k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB
    points = [(s, (alpha + s / rate) * (1 + rng.uniform(-0.01, 0.01))) for s in sizes]
    got = fit(points)
    assert got.bytes_per_s == pytest.approx(rate, rel=0.02)
    assert got.alpha_s == pytest.approx(alpha, rel=0.05, abs=2e-7)
    assert got.seconds(1 << 20) == pytest.approx(alpha + (1 << 20) / rate, rel=0.02)


def test_fit_refuses_what_cannot_be_fitted():
    with pytest.raises(ValueError, match="two message sizes"):
        fit([(1024, 1e-3), (1024, 2e-3)])
    with pytest.raises(ValueError, match="does not grow"):
        fit([(1024, 2e-3), (1 << 20, 1e-3)])


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 3 / 4
    assert bus_factor("broadcast", 16) == 1.0


def test_level_groups_cross_exactly_one_level():
    from launcher.placement.levels import level_groups

    parent = {"n1": "l1", "n2": "l1", "n3": "l2", "n4": "l2", "l1": "sp", "l2": "sp"}
    level = {"l1": 0, "l2": 0, "sp": 1}
    hosts = ["n1", "n1", "n2", "n2", "n3", "n3", "n4", "n4"]  # rank -> node, two ranks per node
    assert level_groups(hosts, parent, level) == {
        "node": [[0, 1], [2, 3], [4, 5], [6, 7]],     # inside a node
        "leaf": [[0, 2], [1, 3], [4, 6], [5, 7]],     # one rank per node under each leaf, every position at once
        "spine": [[0, 4], [1, 5]],                    # one node per leaf under the spine
    }
    assert level_groups(["n1", "n3"], parent, level) == {"spine": [[0, 1]]}  # one rank per node, two leaves


def test_the_slowest_of_n_ranks_is_the_expected_maximum_of_n_draws():
    """Issue 54, item 2: a synchronising collective waits for its slowest rank; from a per-rank distribution's
    quantiles, the slowest of 1 is their mean, of 2 the mean of a pair's larger, and of many the largest measured."""
    from launcher.placement.alphabeta import expected_max

    q = [1.0, 2.0, 3.0, 4.0]
    assert expected_max(q, 1) == pytest.approx(2.5)
    assert expected_max(q, 2) == pytest.approx(sum(max(a, b) for a in q for b in q) / 16)
    assert expected_max(q, 2) < expected_max(q, 8) < expected_max(q, 512) == pytest.approx(4.0)
