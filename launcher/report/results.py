"""A sweep's result.json files, read as RunResults and grouped into table rows: repeats of one configuration
(results with the same `config`) become one row, numbers averaged and phase statistics pooled, with each measure's
95 % confidence interval over the repeats and the per-repeat values that seed-paired ratios need."""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from launcher.report.stats import ci_half_width
from train.contract.common import StateError
from train.contract.result import ResultError, RunResult, Stats

SPREAD = ("train_time_s", "tokens_per_s", "eval_ppl")  # fields whose spread over repeats is reported
ALL_OR_NONE = ("time_to_target_s", "steps_to_target")  # null in any repeat: null for the configuration


def load_results(sweep_dir: Path) -> list[RunResult]:
    """Every <run>/result.json under sweep_dir, sorted by run_id."""
    results = []
    for path in Path(sweep_dir).glob("*/result.json"):
        try:
            results.append(RunResult.load(path))
        except ResultError as e:
            raise StateError(str(e)) from e
    return sorted(results, key=lambda r: r.run_id)


def group_repeats(results: list[RunResult]) -> list[dict]:
    """One table row per configuration: a RunResult's fields (numbers averaged over its repeats, phase
    stats pooled over all their steps, every repeat's layout changes with its run_id), plus `runs` (the run
    ids), `repeats`, `learned` (every repeat's eval perplexity below its baseline; None when no baseline is
    known) and, for the SPREAD fields, `<field>_std` (sample std over repeats), `<field>_ci` (95 % half-width)
    and `<field>_by_repeat` ({repeat index: value}, for pairing by seed); std and ci are None for one run."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        groups.setdefault(r.configuration[0], []).append(r)
    return [_merge(config, runs) for config, runs in groups.items()]


def _fields(result: RunResult) -> dict:
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


def _merge(config: str, runs: list[RunResult]) -> dict:
    rows = [_fields(r) for r in runs]
    merged = dict(rows[0], run_id=config, runs=[r.run_id for r in runs], repeats=len(runs))
    for key, value in rows[0].items():
        if key in ALL_OR_NONE and any(r[key] is None for r in rows):
            merged[key] = None  # a target one repeat never reached is not reached on average
        elif _is_number(value):
            merged[key] = _mean([r[key] for r in rows if _is_number(r[key])])
    merged["layout_changes"] = [{**change, "run_id": r.run_id} for r in runs for change in r.layout_changes]
    merged["faults"] = [{**r.fault, "run_id": r.run_id} for r in runs if r.fault]
    merged["phases"] = {p: Stats.pool([r.phases[p] for r in runs]) for p in runs[0].phases}
    merged["aggregation_event"] = Stats.pool([r.aggregation_event for r in runs])
    for key in SPREAD:
        values = [r[key] for r in rows]
        merged[f"{key}_std"] = statistics.stdev(values) if len(rows) > 1 else None
        merged[f"{key}_ci"] = ci_half_width(values)
        merged[f"{key}_by_repeat"] = {run.configuration[1]: row[key] for run, row in zip(runs, rows)}
    merged["learned"] = learned(runs)
    return merged


def learned(runs: list[RunResult]) -> bool | None:
    """Whether every run's eval perplexity is below the perplexity of the best context-free model of its eval data
    (baseline_ppl): a run at or above it has learned nothing a unigram count would not; None when unknown."""
    if any(r.baseline_ppl is None for r in runs):
        return None
    return all(r.eval_ppl < r.baseline_ppl for r in runs)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mean(values: list):
    return values[0] if all(v == values[0] for v in values) else sum(values) / len(values)  # equal ints stay ints
