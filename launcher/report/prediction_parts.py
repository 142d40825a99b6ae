"""Where a step-time prediction's error lies, and whether a condition passes the rule fixed before its runs.

Each part the step-time model predicts is checked on its own against what the run measured (issue 54, item 1): the
compute stream's busy time (the predicted compute, against compute_only_s: the mean step less the time blocked in
collectives' waits), the exposed traffic (the schedule's exposed seconds, against exposed_comm_s) and the first step
(the steady step and the communicators' first calls, against first_step_s). Means over a configuration's repeats.

The rule (issue 54, item 6), fixed before the validation runs: every configuration within ±20 % (or 2 x its measured
95 % half-width where that is wider), mean |error| <= 10 %, the fastest configuration predicted fastest, and no pair
ordered against the measurement beyond both intervals.
"""
from __future__ import annotations

from launcher.prediction import TOLERANCE
from launcher.report.tables import Table

MEAN_ERROR = 0.10  # the rule's bound on a condition's mean |error|


def rule(rows: list[tuple[str, float, float, float]]) -> tuple[bool, list[str]]:
    """(passes, one line per clause) for registered rows (configuration, predicted, measured, measured 95 % CI
    half-width)."""
    if not rows:
        return False, ["no registered prediction"]
    wide = [r for r in rows if abs(r[1] - r[2]) > max(TOLERANCE * r[2], 2 * r[3])]
    mean = sum(abs(r[1] / r[2] - 1) for r in rows) / len(rows)
    fastest = min(rows, key=lambda r: r[2])[0], min(rows, key=lambda r: r[1])[0]
    swapped = [(a[0], b[0]) for i, a in enumerate(rows) for b in rows[i + 1:]
               if (a[1] - b[1]) * (a[2] - b[2]) < 0 and abs(a[2] - b[2]) > a[3] + b[3]]
    clauses = [
        (not wide, f"within ±{TOLERANCE:.0%} (or 2 x the measured interval): {len(rows) - len(wide)} of {len(rows)}"
         + (f", outside: {', '.join(r[0] for r in wide)}" if wide else "")),
        (mean <= MEAN_ERROR, f"mean |error| {100 * mean:.1f}% (bound {MEAN_ERROR:.0%})"),
        (fastest[0] == fastest[1], f"fastest measured {fastest[0]}, predicted {fastest[1]}"),
        (not swapped, f"pairs ordered against the measurement beyond both intervals: {len(swapped)}"
         + (f" ({', '.join(f'{a} / {b}' for a, b in swapped[:4])}{' ...' if len(swapped) > 4 else ''})"
            if swapped else "")),
    ]
    return all(ok for ok, _ in clauses), [("pass: " if ok else "MISS: ") + text for ok, text in clauses]


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _error(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured - 1 if predicted is not None and measured else None


def parts_table(grouped: list[dict], by_id: dict, registered: dict[str, dict]) -> Table | None:
    """One row per configuration whose every repeat has a registered prediction of its parts (registries from
    before the schedule have none: None when no row is left)."""
    rows = []
    for r in grouped:
        preds = [registered.get(run) for run in r["runs"]]
        if not all(p and "predicted_exposed_comm_s" in p for p in preds):
            continue
        p, results = preds[0], [by_id[run] for run in r["runs"]]
        exposed = sum(v for k, v in p["predicted_exposed_comm_s"].items() if k != "by_level")
        measured = [_mean([x.compute_only_s for x in results]), _mean([x.exposed_comm_s for x in results]),
                    _mean([x.first_step_s for x in results])]
        predicted = [p["predicted_compute_s"], exposed, p.get("predicted_first_step_s")]
        rows.append([r["run_id"], *(v for pair in zip(predicted, measured) for v in (*pair, _error(*pair)))])
    if not rows:
        return None
    columns = ["run_id"] + [f"{side}_{part}" for part in ("compute_s", "exposed_comm_s", "first_step_s")
                            for side in ("predicted", "measured", "error")]
    headers = ["Run"] + [f"{part}: {side}" for part in ("Compute (s)", "Exposed comm (s)", "First step (s)")
                         for side in ("predicted", "measured", "error")]
    table = Table("Each part of the step, registered prediction vs measured (means over the repeats)", columns,
                  rows, ["text"] + ["auto", "auto", "percent"] * 3, headers=headers)
    table.notes.append("Compute: the compute stream's busy seconds (on CPU with processor sharing) against "
                       "compute_only_s, the mean step less the time blocked in collectives' waits; exposed comm: "
                       "what the schedule leaves the compute stream waiting for, against exposed_comm_s; first step: "
                       "the steady step and each communicator's first calls, against first_step_s (FSDP2's lazy "
                       "initialisation and first allocations are not priced).")
    return table
