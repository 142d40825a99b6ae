"""The studies' headline figures, recomputed from the committed runs (tests/test_studies.py checks that each
study's README quotes them): seed-paired ratios between any two configurations, also across two sweeps, by a
second implementation (a Student t interval whose quantile mpmath finds from the regularized incomplete beta
function), not the report's launcher.report.stats (which integrates the t density)."""
from __future__ import annotations

import csv
import functools
import json
import math
import statistics

import mpmath

from tests.support import ROOT

RESULTS = ROOT / "results"


def by_seed(where: str, **match) -> dict[int, dict]:
    """seed -> result.json of the runs under results/<where> whose result has every `match` value."""
    runs = {}
    for spec in sorted((RESULTS / where).glob("*/spec.json")):
        result = json.loads((spec.parent / "result.json").read_text())
        if all(result.get(k) == v for k, v in match.items()):
            seed = json.loads(spec.read_text())["train"]["seed"]
            assert seed not in runs, f"{where}: two runs of seed {seed} match {match}"
            runs[seed] = result
    return runs


def ratio(key: str, base: dict[int, dict], other: dict[int, dict]) -> tuple[float, float, float]:
    """base's `key` / other's, a geometric mean over the seeds both ran (at least 3) with its 95 % interval."""
    seeds = sorted(base.keys() & other.keys())
    assert len(seeds) >= 3, f"only seeds {seeds} to pair"
    return log_interval([base[s][key] / other[s][key] for s in seeds])


def log_interval(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of `ratios` and its 95 % interval: the Student t interval of the mean log ratio."""
    logs = [math.log(r) for r in ratios]
    mean, sem = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    half = t_quantile(len(logs) - 1) * sem
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


@functools.cache
def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided `level` quantile of Student's t with df degrees of freedom: the q at which the regularized
    incomplete beta function I_{df/(df+q^2)}(df/2, 1/2), the probability of |t| > q, equals 1 - level."""
    def beyond_minus_tail(q):
        return mpmath.betainc(mpmath.mpf(df) / 2, 0.5, 0, df / (df + q * q), regularized=True) - (1 - level)

    with mpmath.workdps(30):
        return float(mpmath.findroot(beyond_minus_tail, (mpmath.mpf(1), mpmath.mpf(64)), solver="anderson",
                                     maxsteps=500, tol=1e-50))


def cell(r: tuple[float, float, float], digits: int = 3) -> str:
    """How the READMEs write a ratio: 1.234× (1.200–1.270)."""
    return f"{r[0]:.{digits}f}× ({r[1]:.{digits}f}–{r[2]:.{digits}f})"


def largest_gap(base: dict[int, dict], other: dict[int, dict]) -> float:
    """The largest relative difference of eval perplexity between paired runs over all their evaluations."""
    return max(abs(o[2] / b[2] - 1) for s in base.keys() & other.keys()
               for b, o in zip(base[s]["eval_history"], other[s]["eval_history"], strict=True))


def table3(where: str) -> list[dict]:
    """The rows of results/<where>/table3.csv."""
    return list(csv.DictReader((RESULTS / where / "table3.csv").read_text().splitlines()))
