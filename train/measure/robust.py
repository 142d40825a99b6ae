"""Statistics that survive a noisy machine, for the probe: medians with a distribution-free interval, quantiles,
and Theil-Sen slopes over layer counts, so noise widens an interval instead of stopping a calibration.

Pure Python (no torch): a rank's timings arrive as lists of seconds. Eight ranks on two cores give step times with
outliers of several times the median (issue 54, item 5: 18 to 56 ms for one model), which a mean or a least-squares
line follows and a median does not.
"""
from __future__ import annotations

import math
import statistics

QUANTILES = 21  # 0 %, 5 %, ..., 100 %: what probe.json keeps of a timing distribution


def median(values: list[float]) -> float:
    return statistics.median(values)


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: the order statistics x_(j), x_(n+1-j) with the largest j for
    which P(Binomial(n, 1/2) < j) <= (1 - level) / 2. It assumes nothing about the noise's shape; below 6 samples
    no j qualifies and it is the whole range (coverage 1 - 2^(1-n), lower than `level`)."""
    xs = sorted(values)
    n = len(xs)
    tail, j, cumulative = (1 - level) / 2, 0, 0.0
    if n > 200:  # the binomial's normal approximation, exact enough here and linear in n
        z = statistics.NormalDist().inv_cdf(1 - tail)
        j = int((n - z * math.sqrt(n)) / 2)
    while n <= 200 and j < n // 2:
        cumulative += math.comb(n, j) / 2 ** n
        if cumulative > tail:
            break
        j += 1
    j = max(j, 1)  # 1-based order statistic; j = 1: the range
    return xs[j - 1], xs[n - j]


def quantiles(values: list[float], k: int = QUANTILES) -> list[float]:
    """k evenly spaced quantiles from the minimum to the maximum (linear between order statistics)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs * k
    out = []
    for i in range(k):
        at = i * (len(xs) - 1) / (k - 1)
        lo = int(at)
        out.append(xs[lo] if lo + 1 >= len(xs) else xs[lo] + (at - lo) * (xs[lo + 1] - xs[lo]))
    return out


def theil_sen(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept): the median of the pairwise slopes and the median of y - slope x; one outlying point
    moves neither, where it drags a least-squares line."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    if not slopes:
        raise ValueError("a slope needs at least two distinct x")
    slope = statistics.median(slopes)
    return slope, statistics.median(y - slope * x for x, y in zip(xs, ys))


def summary(values: list[float]) -> dict:
    """{median, interval ([low, high], 95 %), n}: a point estimate with its spread, as probe.json keeps them."""
    lo, hi = median_interval(values)
    return {"median": median(values), "interval": [lo, hi], "n": len(values)}


def resolved(interval: list[float] | tuple[float, float]) -> bool:
    """Whether an interval excludes zero from below: a layer that certainly costs something."""
    return interval[0] > 0
