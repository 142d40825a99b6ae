"""A sweep's result.json files, read and grouped: repeats of one configuration (run ids ending in -repN)
become one entry, numbers averaged and phase statistics pooled, so noise shows as a spread."""
from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from launcher.errors import StateError

SPREAD = ("train_time_s", "tokens_per_s", "eval_ppl")  # fields whose spread over repeats is reported
_REPEAT = re.compile(r"-rep\d+$")


def load_results(sweep_dir: Path) -> list[dict]:
    """Every <run>/result.json under sweep_dir, sorted by run_id."""
    results = []
    for path in Path(sweep_dir).glob("*/result.json"):
        try:
            results.append(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise StateError(f"{path}: not valid JSON ({e})") from e
    return sorted(results, key=lambda r: r["run_id"])


def group_repeats(results: list[dict]) -> list[dict]:
    """One dict per configuration: numbers averaged over its repeats, phase stats pooled over all their steps,
    plus `repeats` and `<field>_std` (sample std over repeats; None for one run) for the SPREAD fields."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(_REPEAT.sub("", r["run_id"]), []).append(r)
    return [_merge(config, runs) for config, runs in groups.items()]


def _merge(config: str, runs: list[dict]) -> dict:
    if len(runs) == 1 and "repeats" in runs[0]:  # grouped already
        return runs[0]
    merged = dict(runs[0], run_id=config, repeats=len(runs))
    for key, value in runs[0].items():
        if _is_number(value):
            merged[key] = _mean([r[key] for r in runs if _is_number(r.get(key))])
    merged["phases"] = {p: _pool([r["phases"][p] for r in runs]) for p in runs[0]["phases"]}
    if "aggregation_event" in runs[0]:
        merged["aggregation_event"] = _pool([r["aggregation_event"] for r in runs])
    for key in SPREAD:
        merged[f"{key}_std"] = statistics.stdev(r[key] for r in runs) if len(runs) > 1 else None
    return merged


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mean(values: list):
    return values[0] if all(v == values[0] for v in values) else sum(values) / len(values)  # equal ints stay ints


def _pool(stats: list[dict]) -> dict:
    """Exact mean and population std over the union of the runs' samples, from each run's (mean, std, n)."""
    stats = [s for s in stats if s["n"] and s["mean"] is not None]
    n = sum(s["n"] for s in stats)
    if not n:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(s["n"] * s["mean"] for s in stats) / n
    square = sum(s["n"] * (s["std"] ** 2 + s["mean"] ** 2) for s in stats) / n
    return {"mean": mean, "std": math.sqrt(max(0.0, square - mean**2)), "n": n}
