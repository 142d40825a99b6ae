"""A collective's price from a probe: the runs' own groups first, alpha per ring step, the slowest of n (jitter)."""
import pytest

from launcher.placement.alphabeta import expected_max
from launcher.placement.network import Network, Spread, ring_steps

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def _level(collective, alpha=0.001, link=100.0, ranks=2, dist=None, points=None):
    row = {"level": "leaf", "collective": collective, "ranks": ranks, "alpha_s": alpha, "link_bytes_per_s": link,
           "flows": 1}
    if dist is not None:
        row |= {"dist": dist, "points": points}
    return row


def test_the_runs_own_group_is_priced_by_its_own_fit_where_it_matches():
    """A scale row for 4-rank all_gathers at the leaf with 2 flows replaces the level fit for exactly that group;
    another group size, level or flow count still uses the level's 2-rank fit."""
    own = {"collective": "all_gather", "ranks": 4, "level": "leaf", "flows": 2, "alpha_s": 0.01, "bytes_per_s": 50.0}
    network = Network.from_probe({"levels": [_level(c) for c in COLLECTIVES], "scale": [own]}, "probe test")
    assert network.seconds("all_gather", 100, 4, {0: 2}) == pytest.approx(0.01 + 100 / 50)
    level = 0.001 + 100 * 3 / 4 * 2 / 100  # alpha + size x busfactor(4) x flows / link
    assert network.seconds("all_gather", 100, 4, {0: 1}) != pytest.approx(0.01 + 100 / 50)
    assert network.seconds("all_gather", 100, 4, {0: 2}) != pytest.approx(level)
    assert network.seconds("reduce_scatter", 100, 4, {0: 2}) == pytest.approx(level)


def test_alpha_grows_per_ring_step_where_the_level_has_two_ring_lengths():
    """2-rank pairs (alpha 2 ms, 1 ring step) and an 8-rank group (alpha 9 ms, 7 steps) at the leaf: a 4-rank group
    at another flow count is priced with alpha_0 + 3 steps x 7/6 ms, not the pairs' 2 ms."""
    own = {"collective": "all_gather", "ranks": 8, "level": "leaf", "flows": 1, "alpha_s": 0.009,
           "bytes_per_s": 1e9}
    network = Network.from_probe({"levels": [_level(c, alpha=0.002) for c in COLLECTIVES], "scale": [own]},
                                 "probe test")
    link = network.links[("leaf", "all_gather")]
    assert link.step_alpha_s == pytest.approx(0.007 / 6)
    assert link.alpha_s + ring_steps("all_gather", 2) * link.step_alpha_s == pytest.approx(0.002)
    priced = network.seconds("all_gather", 0, 4, {0: 3})
    assert priced == pytest.approx(0.002 + 2 * 0.007 / 6)
    # a latency that would fall below 0 at no ring step: the line through the origin
    steep = {**own, "alpha_s": 0.030}
    link = Network.from_probe({"levels": [_level(c) for c in COLLECTIVES], "scale": [steep]}, "t").links[
        ("leaf", "all_gather")]
    assert link.alpha_s == 0.0 and link.step_alpha_s == pytest.approx((0.001 + 7 * 0.030) / 50)
    # a level without rows at two ring lengths keeps its one latency
    assert network.links[("leaf", "all_reduce")].step_alpha_s == 0.0


def test_a_synchronising_collective_costs_the_slowest_of_its_ranks():
    """Per-call seconds spread 1..10 ms at one size: 8 ranks wait for the expected slowest of 8 draws, over the
    median the fit was made on; a probe without distributions prices the fit alone."""
    quantiles = [0.001 * k for k in range(1, 11)]
    dist = [{"bytes": 100, "quantiles_s": quantiles}]
    plain = Network.from_probe({"levels": [_level(c) for c in COLLECTIVES]}, "probe test")
    spread = Network.from_probe({"levels": [_level(c, dist=dist, points=[[100, 0.005]]) for c in COLLECTIVES]},
                                "probe test")
    base = plain.seconds("all_reduce", 100, 8, {0: 1})
    assert spread.seconds("all_reduce", 100, 8, {0: 1}) == pytest.approx(base * expected_max(quantiles, 8) / 0.005)
    assert expected_max(quantiles, 8) / 0.005 > 1.5
    # never below the fit: a distribution whose slowest is faster than the fitted seconds leaves the price alone
    fast = Spread(((100.0, (0.001, 0.002), 0.005),))
    assert fast.slowest_of(8, 100) == 1.0


def test_the_spread_of_the_nearest_size_timed_is_used():
    spread = Spread(((1024.0, (1.0, 1.0), 1.0), (4096.0, (1.0, 3.0), 1.0)))
    assert spread.slowest_of(2, 1500) == 1.0                     # nearer 1 KiB (in ratio)
    assert spread.slowest_of(2, 3000) == pytest.approx(expected_max([1.0, 3.0], 2))
