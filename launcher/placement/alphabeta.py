"""Latency-bandwidth (alpha-beta) fits of measured collectives, with bus bandwidth computed as nccl-tests does.

A collective of `size` bytes on n ranks takes t = alpha + size / algbw; nccl-tests reports the bus bandwidth
busbw = algbw x factor(n), the rate each link must sustain, so one number per link compares collectives of
different kinds and communicator sizes. Pure Python: the planner reads probe.json without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and
    all_to_all, 1 for broadcast. Sizes are the whole buffer (all_gather's output, reduce_scatter's input)."""
    n = ranks
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0}[collective]


@dataclass(frozen=True)
class Fit:
    """t(size) = alpha_s + size / bytes_per_s (algorithm bandwidth); busbw = bytes_per_s x bus_factor."""

    alpha_s: float
    bytes_per_s: float

    def seconds(self, size: float) -> float:
        return self.alpha_s + size / self.bytes_per_s


def fit(points: list[tuple[float, float]]) -> Fit:
    """Least squares of seconds on bytes, weighted by 1/t: between absolute errors (the largest message alone
    would fix the line) and relative ones (the many latency-bound small messages would, and a link whose rate
    sags with size, like TCP through a shaped queue, would be credited its small-message burst rate); alpha is
    clamped at 0 (a negative latency is noise)."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("an alpha-beta fit needs at least two message sizes")
    w = [1.0 / max(t, 1e-12) for _, t in points]
    sw = sum(w)
    sx = sum(wi * b for wi, (b, _) in zip(w, points))
    sy = sum(wi * t for wi, (_, t) in zip(w, points))
    sxx = sum(wi * b * b for wi, (b, _) in zip(w, points))
    sxy = sum(wi * b * t for wi, (b, t) in zip(w, points))
    slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    alpha = (sy - slope * sx) / sw
    if alpha < 0:  # refit through the origin
        alpha, slope = 0.0, sxy / sxx
    if slope <= 0:
        raise ValueError("time does not grow with message size: no bandwidth can be fitted")
    return Fit(alpha, 1.0 / slope)



def expected_max(quantiles: list[float], n: int) -> float:
    """The expected slowest of n ranks: E[max of n independent draws] from a per-rank distribution given by evenly
    spaced quantiles (probe.json's `quantiles_s`), taken as m equally likely values x_1 <= ... <= x_m:
    sum_k x_k ((k/m)^n - ((k-1)/m)^n). n = 1 gives their mean; a large n tends to the largest measured. A
    synchronising collective on n ranks waits for the slowest, so this, not the median, is what it costs a step."""
    xs, m = sorted(quantiles), len(quantiles)
    return sum(x * ((k / m) ** n - ((k - 1) / m) ** n) for k, x in enumerate(xs, start=1))
