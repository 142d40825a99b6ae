"""Predicted beside measured: the step-time model's estimate for every run (plan.json) against the step the run
measured (train_time_s / steps), the error in %, whether the predicted order of the runs is the measured one,
and prediction.png (log-log, y = x)."""
from __future__ import annotations

from pathlib import Path

from launcher.report.tables import Table, paper_order
from train.result import RunResult

TOLERANCE = 0.20  # the band the plot shades and the notes count against


def measured_step(r: RunResult) -> float:
    return r.train_time_s / r.steps


def prediction_table(results: list[RunResult], plan: dict) -> Table | None:
    """None when plan.json predates the step-time model (no predicted_step_s)."""
    entries = {e["run_id"]: e for e in plan["runs"] if "predicted_step_s" in e}
    rows = []
    for r in sorted(results, key=lambda r: paper_order(vars(r))):
        e = entries.get(r.run_id)
        if e is None or not e["predicted_step_s"]:
            continue
        measured = measured_step(r)
        full, none = e["predicted_step_bounds_s"]
        by_group = e["predicted_comm_by_group_s"]
        rows.append([r.run_id, e["predicted_step_s"], measured, 100 * (e["predicted_step_s"] / measured - 1),
                     full, none, e["predicted_compute_s"], by_group["shard"], by_group["replicate"],
                     by_group["federation"]])
    if not rows:
        return None
    table = Table("Step time: predicted (step-time model, plan.json) vs measured (train_time_s / steps)",
                  ["run_id", "predicted_step_s", "measured_step_s", "error_pct", "predicted_full_overlap_s",
                   "predicted_no_overlap_s", "predicted_compute_s", "predicted_shard_comm_s",
                   "predicted_replicate_comm_s", "predicted_federation_comm_s"],
                  rows, ["text", "auto", "auto", "fixed", "auto", "auto", "auto", "auto", "auto", "auto"])
    within = sum(abs(row[3]) <= 100 * TOLERANCE for row in rows)
    table.notes.append(f"{within} of {len(rows)} runs predicted within ±{TOLERANCE:.0%}; largest error "
                       f"{max(rows, key=lambda row: abs(row[3]))[3]:+.1f}% ({max(rows, key=lambda row: abs(row[3]))[0]}).")
    table.notes.append(order_note([(row[0], row[1], row[2]) for row in rows]))
    sources = {entries[row[0]]["compute_source"] for row in rows}
    table.notes.append(f"network: {plan.get('network', 'unknown')}; compute: {'; '.join(sorted(sources))}.")
    return table


def order_note(runs: list[tuple[str, float, float]]) -> str:
    """Whether sorting by predicted step gives the measured order, and which pairs swap if not."""
    swapped = [(a[0], b[0]) for i, a in enumerate(runs) for b in runs[i + 1:]
               if (a[1] - b[1]) * (a[2] - b[2]) < 0]
    if not swapped:
        return f"Order: the {len(runs)} runs sorted by predicted step time are in their measured order."
    shown = ", ".join(f"{a} / {b}" for a, b in swapped[:6]) + (" ..." if len(swapped) > 6 else "")
    return (f"Order: {len(swapped)} of {len(runs) * (len(runs) - 1) // 2} pairs of runs are predicted in the "
            f"other order than measured: {shown}.")


def prediction_plot(table: Table, path: Path) -> Path:
    """Predicted against measured step time, log-log, the y = x line and the ±TOLERANCE band."""
    import matplotlib.pyplot as plt

    from launcher.report.plots import MARKERS, save_png

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, row in enumerate(table.rows):
        ax.scatter(row[2], row[1], marker=MARKERS[i % len(MARKERS)], label=row[0], zorder=3)
    values = [v for row in table.rows for v in (row[1], row[2])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)], [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)],
                    color="grey", alpha=0.2, label=f"±{TOLERANCE:.0%}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (s)",
           ylabel="predicted step (s)", title="Step time: predicted vs measured")
    ax.legend(fontsize=6)
    return save_png(fig, path)
