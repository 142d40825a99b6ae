"""Statistics for "is it different?": 95 % confidence intervals over repeats (Student t) and ratios paired by
seed, so a table says how sure it is rather than printing a single sample as a finding."""
from __future__ import annotations

import functools
import math
import statistics

LEVEL = 0.95  # every interval the reports print is a 95 % one


def _t_density(x: float, df: int) -> float:
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))


def _t_cdf_above_half(x: float, df: int, pieces: int = 2000) -> float:
    """P(T <= x) - 1/2 for x >= 0, by Simpson's rule on the density (smooth, so 2000 pieces give ~1e-10)."""
    h = x / pieces
    inner = sum((4 if i % 2 else 2) * _t_density(i * h, df) for i in range(1, pieces))
    return h / 3 * (_t_density(0.0, df) + inner + _t_density(x, df))


@functools.lru_cache(maxsize=None)  # ~40 ms a call; a table asks for a few df values many times
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom (12.706 for df = 1, 2.776 for
    df = 4 at 95 %), by bisection on the CDF: no SciPy for one number."""
    if df < 1:
        raise ValueError(f"Student t needs df >= 1, got {df}")
    target = level / 2
    lo, hi = 0.0, 1.0
    while _t_cdf_above_half(hi, df) < target:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf_above_half(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


def ci_half_width(values: list[float]) -> float | None:
    """The 95 % confidence half-width of the mean of `values` (Student t, n - 1 df); None below two values."""
    if len(values) < 2:
        return None
    return t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def paired_ratio(base: list[float], other: list[float]) -> tuple[float, float | None, float | None]:
    """(ratio, low, high): the geometric mean of base_i / other_i over pairs that share a seed, with its 95 %
    interval (ratio_interval)."""
    if len(base) != len(other) or not base:
        raise ValueError("paired_ratio needs two equally long, non-empty lists of paired values")
    return ratio_interval([b / o for b, o in zip(base, other)])


def ratio_interval(ratios: list[float]) -> tuple[float, float | None, float | None]:
    """(ratio, low, high): the geometric mean of `ratios` with the 95 % interval of that mean taken on the log
    ratios (so it is symmetric in "faster" and "slower"). One ratio gives the ratio alone (low, high None)."""
    if not ratios:
        raise ValueError("ratio_interval needs at least one ratio")
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = ci_half_width(logs)
    if half is None:
        return math.exp(mean), None, None
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
