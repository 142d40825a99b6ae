"""Predicted beside measured: the step-time model's estimate registered for every run before it started
(launcher.records.registry; plan.json's, labelled post hoc, where none was) against the step the run measured
(steady_step_s where every repeat recorded it, else train_time_s / steps; the mean over a configuration's repeats
with its 95 % interval), the error, whether the predicted order of the configurations is the measured one (a swap
within the measured intervals is labelled as noise), and prediction.png (log-log, y = x). The model predicts a
steady-state step, and train_time_s / steps carries the first steps' communicator set-up: results that record
steady_step_s are compared with it, like with like, and the table says which measurement each row used."""
from __future__ import annotations

from pathlib import Path

from launcher.prediction import TOLERANCE  # the band the plot shades and the notes count against
from launcher.records.registry import before, model_name
from launcher.report.prediction_parts import rule
from launcher.report.results import group_repeats
from launcher.report.stats import ci_half_width
from launcher.report.tables import Table, model_parallel, paper_order, span_note
from train.contract.result import RunResult

COLUMNS = ["run_id", "strategy", "placement", "model", "seq_len", "predicted_step_s", "measured_step_s",
           "measured_ci_s", "error", "predicted_at", "started_at", "basis", "n", "predicted_full_overlap_s",
           "predicted_no_overlap_s", "predicted_compute_s", "predicted_shard_comm_s", "predicted_replicate_comm_s",
           "predicted_federation_comm_s"]
HEADERS = ["Run", "Strategy", "Placement", "Model", "Seq len", "Predicted step (s)", "Measured step (s)",
           "Measured ± 95 % (s)", "Error", "Predicted at", "Started at", "Basis", "n", "Predicted, full overlap (s)",
           "Predicted, no overlap (s)", "Predicted compute (s)", "Predicted shard comm (s)",
           "Predicted replicate comm (s)", "Predicted federation comm (s)"]  # prediction.csv keeps COLUMNS
KINDS = ["text"] * 5 + ["auto"] * 3 + ["percent"] + ["text"] * 3 + ["auto"] * 7
PREDICTED, MEASURED, CI, ERROR, BASIS = (COLUMNS.index(c) for c in ("predicted_step_s", "measured_step_s",
                                                                    "measured_ci_s", "error", "basis"))
STEADY = "steady_step_s"  # what measured_as says of a row measured in steady state
WHOLE = "train_time_s / steps"


def measured_step(r: dict, by_id: dict[str, RunResult]) -> tuple[float, float | None, str]:
    """(mean step, its 95 % half-width over the repeats or None, which it is) of a grouped configuration: the
    steady-state step where every repeat recorded one (RunResult.steady_step_s), else train_time_s / steps."""
    steady = [by_id[run].steady_step_s for run in r["runs"]]
    if all(v is not None for v in steady):
        return sum(steady) / len(steady), ci_half_width(steady), STEADY
    ci = r["train_time_s_ci"] / r["steps"] if r["train_time_s_ci"] is not None else None
    return r["train_time_s"] / r["steps"], ci, WHOLE


def _basis(runs: list[str], registered: dict[str, dict], started: dict[str, str | None]) -> str:
    """registered: every repeat's prediction was stored before that repeat started; else post hoc."""
    return "registered" if all(run in registered and before(registered[run]["predicted_at"], started[run])
                               for run in runs) else "post hoc"


def prediction_table(results: list[RunResult], plan: dict, registered: dict[str, dict] | None = None,
                     placement: str | None = None) -> Table | None:
    """One row per configuration (repeats grouped): the prediction registered before its runs started
    (registry.py), else plan.json's, labelled post hoc and left out of the accuracy notes. Predictions made with
    compute unknown (communication only) are not step-time predictions and are left out. None when no row is
    left."""
    registered = registered or {}
    entries = {e["run_id"]: e for e in plan["runs"] if "predicted_step_s" in e}
    started = {r.run_id: r.started_at for r in results}
    by_id = {r.run_id: r for r in results}
    rows, shrunk, blind, sources, measured_as = [], [], [], set(), []
    grouped = sorted(group_repeats(results), key=paper_order)
    for r in grouped:
        basis = _basis(r["runs"], registered, started)
        e = registered.get(r["runs"][0]) if basis == "registered" else entries.get(r["runs"][0])
        if e is None or not e["predicted_step_s"]:
            continue
        if e["compute_source"].startswith("unknown"):
            blind.append(r["run_id"])
            continue
        if r["layout_changes"]:  # its measured step mixes two layouts, the prediction priced one
            shrunk.append(r["run_id"])
            continue
        measured, ci, how = measured_step(r, by_id)
        measured_as.append(how)
        full, none = e["predicted_step_bounds_s"]
        by_group = e["predicted_comm_by_group_s"]
        times = [registered[run]["predicted_at"] for run in r["runs"] if run in registered]
        starts = [started[run] for run in r["runs"] if started[run]]
        model = e["model"] if basis == "registered" else model_name(e.get("model") or {})
        sources.add(e["compute_source"])
        rows.append([r["run_id"], r["strategy"], e.get("placement", placement), model,
                     r["seq_len"], e["predicted_step_s"], measured, ci, e["predicted_step_s"] / measured - 1,
                     min(times) if times else None, min(starts) if starts else None, basis, r["repeats"], full, none,
                     e["predicted_compute_s"], by_group["shard"], by_group["replicate"], by_group["federation"]])
    if not rows:
        return None
    columns, headers, kinds = COLUMNS, HEADERS, KINDS
    steady = STEADY in measured_as
    if steady:  # which measurement each row compares with (results before steady_step_s keep their table as it was)
        columns, headers, kinds = [*columns, "measured_as"], [*headers, "Measured as"], [*kinds, "text"]
        rows = [[*row, how] for row, how in zip(rows, measured_as)]
    if model_parallel(grouped):  # the degrees as numbers, not only inside the run ids
        columns, headers, kinds = [*columns, "pp", "tp"], [*headers, "P", "T"], [*kinds, "auto", "auto"]
        degrees = {r["run_id"]: [r["pp"], r["tp"]] for r in grouped}
        rows = [[*row, *degrees[row[0]]] for row in rows]
    table = Table("Step time: predicted (registered before the runs started, else post hoc) vs measured "
                  + ("(the steady-state step, steady_step_s; train_time_s / steps where a run did not record it)"
                     if steady else "(train_time_s / steps)"), columns, rows, kinds, headers=headers)

    if blind:
        table.notes.append(f"Not shown: {', '.join(blind)}, planned with compute unknown (no probe, no peak_flops): "
                           f"a communication-only estimate is no step-time prediction; run action=probe first.")
    if shrunk:
        table.notes.append(f"Left out: {', '.join(shrunk)}, whose runs lost nodes and resumed on another layout "
                           f"(retry_shrink).")
    counted = [row for row in rows if row[BASIS] == "registered"]
    post_hoc = [row[0] for row in rows if row[BASIS] != "registered"]
    if post_hoc:
        table.notes.append(f"Post hoc: {', '.join(post_hoc)} had no prediction registered before their runs "
                           f"started; they are shown, not counted in any accuracy figure.")
    if counted:
        worst = max(counted, key=lambda row: abs(row[ERROR]))
        within = sum(abs(row[ERROR]) <= TOLERANCE for row in counted)
        mean = sum(abs(row[ERROR]) for row in counted) / len(counted)
        table.notes.append(f"{within} of {len(counted)} registered predictions within ±{TOLERANCE:.0%}; largest "
                           f"error {100 * worst[ERROR]:+.1f}% ({worst[0]}); mean |error| {100 * mean:.1f}%.")
        judged = [(row[0], row[PREDICTED], row[MEASURED], row[CI] or 0.0) for row in counted]
        table.notes.append(order_note(judged))
        if steady:  # conditions measured since the rule was fixed (issue 54) are judged by it
            passes, clauses = rule(judged)
            table.notes.append(f"Rule fixed before the runs: {'PASS' if passes else 'MISS'} ({'; '.join(clauses)}).")
    else:
        table.notes.append("No prediction was registered before its runs started: no accuracy is claimed.")
    table.notes.append(f"network: {plan.get('network', 'unknown')}; compute: {'; '.join(sorted(sources))}.")
    if any(row[CI] is not None for row in rows):
        table.notes.append("Measured step: mean ± 95 % half-width over the repeats. " + span_note(results))
    if steady:
        whole = [row[0] for row, how in zip(rows, measured_as) if how == WHOLE]
        table.notes.append("Measured step: steady_step_s (the steps after the second, in whole aggregation periods: "
                           "the steady state the model predicts, without the first steps' communicator set-up)"
                           + (f"; train_time_s / steps for {', '.join(whole)}, whose results do not record it"
                              if whole else "") + ".")
    return table


def order_note(runs: list[tuple[str, float, float, float]]) -> str:
    """Whether sorting by predicted step gives the measured order; (run, predicted, measured, measured 95 % CI
    half-width). A swapped pair whose measured steps differ by less than their two intervals added is within
    noise: the measurement does not order them."""
    swapped = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:] if (a[1] - b[1]) * (a[2] - b[2]) < 0]
    if not swapped:
        return f"Order: the {len(runs)} configurations sorted by predicted step time are in their measured order."
    noise = [(a, b) for a, b in swapped if abs(a[2] - b[2]) <= a[3] + b[3]]
    shown = ", ".join(f"{a[0]} / {b[0]}" + (" (within noise)" if (a, b) in noise else "")
                      for a, b in swapped[:6]) + (" ..." if len(swapped) > 6 else "")
    return (f"Order: {len(swapped)} of {len(runs) * (len(runs) - 1) // 2} pairs are predicted in the other order "
            f"than measured, {len(noise)} of them within the measured 95 % intervals: {shown}.")


def prediction_plot(table: Table, path: Path) -> Path:
    """Predicted against measured step time, log-log, the y = x line and the ±TOLERANCE band."""
    import matplotlib.pyplot as plt

    from launcher.report.plots import MARKERS, save_png

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, row in enumerate(table.rows):  # post hoc predictions hollow
        registered = row[BASIS] == "registered"
        ax.errorbar(row[MEASURED], row[PREDICTED], xerr=row[CI], marker=MARKERS[i % len(MARKERS)], zorder=3,
                    label=row[0] + ("" if registered else " (post hoc)"), mfc=None if registered else "none")
    values = [v for row in table.rows for v in (row[PREDICTED], row[MEASURED])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)],
                    [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)], color="grey", alpha=0.2, label=f"±{TOLERANCE:.0%}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (s)",
           ylabel="predicted step (s)", title="Step time: predicted vs measured")
    ax.legend(fontsize=6)
    return save_png(fig, path)
