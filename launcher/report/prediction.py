"""Predicted beside measured: the step-time model's estimate for every run (plan.json) against the step the run
measured (train_time_s / steps; the mean over a configuration's repeats, with their spread), the error in %,
whether the predicted order of the configurations is the measured one (a swap within the measured spread is
labelled as noise), and prediction.png (log-log, y = x)."""
from __future__ import annotations

from pathlib import Path

from launcher.report.results import group_repeats
from launcher.report.tables import Table, paper_order
from train.result import RunResult

TOLERANCE = 0.20  # the band the plot shades and the notes count against


def prediction_table(results: list[RunResult], plan: dict) -> Table | None:
    """One row per configuration (repeats grouped); None when plan.json predates the step-time model."""
    entries = {e["run_id"]: e for e in plan["runs"] if "predicted_step_s" in e}
    rows, sources, shrunk = [], [], []  # sources: each row's compute source
    for r in sorted(group_repeats(results), key=paper_order):
        e = entries.get(r["runs"][0])  # repeats share a layout, so a prediction
        if e is None or not e["predicted_step_s"]:
            continue
        if r["layout_changes"]:  # its measured step mixes two layouts, the prediction priced one
            shrunk.append(r["run_id"])
            continue
        measured = r["train_time_s"] / r["steps"]
        spread = r["train_time_s_std"] / r["steps"] if r["train_time_s_std"] is not None else None
        full, none = e["predicted_step_bounds_s"]
        by_group = e["predicted_comm_by_group_s"]
        sources.append(e["compute_source"])
        rows.append([r["run_id"], e["predicted_step_s"], measured, spread, r["repeats"],
                     100 * (e["predicted_step_s"] / measured - 1), full, none, e["predicted_compute_s"],
                     by_group["shard"], by_group["replicate"], by_group["federation"]])
    if not rows:
        return None
    table = Table("Step time: predicted (step-time model, plan.json) vs measured (train_time_s / steps)",
                  ["run_id", "predicted_step_s", "measured_step_s", "measured_step_std_s", "runs", "error_pct",
                   "predicted_full_overlap_s", "predicted_no_overlap_s", "predicted_compute_s",
                   "predicted_shard_comm_s", "predicted_replicate_comm_s", "predicted_federation_comm_s"],
                  rows, ["text"] + ["auto"] * 4 + ["fixed"] + ["auto"] * 6)
    if shrunk:
        table.notes.append(f"Left out: {', '.join(shrunk)}, whose runs lost nodes and resumed on another layout "
                           f"(retry_shrink).")
    unknown = [source for source in sources if source.startswith("unknown")]
    if unknown:
        table.notes.append(f"Compute was unknown when {len(unknown)} of these were planned (no probe, no peak_flops): "
                           f"their predictions are communication only, so their errors are not the model's; "
                           f"run action=probe before the sweep.")
    worst = max(rows, key=lambda row: abs(row[5]))
    within = sum(abs(row[5]) <= 100 * TOLERANCE for row in rows)
    table.notes.append(f"{within} of {len(rows)} configurations predicted within ±{TOLERANCE:.0%}; largest error "
                       f"{worst[5]:+.1f}% ({worst[0]}).")
    table.notes.append(order_note([(row[0], row[1], row[2], row[3] or 0.0) for row in rows]))
    table.notes.append(f"network: {plan.get('network', 'unknown')}; compute: {'; '.join(sorted(set(sources)))}.")
    return table


def order_note(runs: list[tuple[str, float, float, float]]) -> str:
    """Whether sorting by predicted step gives the measured order; (run, predicted, measured, measured std).
    A swapped pair whose measured steps differ by less than their two spreads added is within noise."""
    swapped = [(a, b) for i, a in enumerate(runs) for b in runs[i + 1:] if (a[1] - b[1]) * (a[2] - b[2]) < 0]
    if not swapped:
        return f"Order: the {len(runs)} configurations sorted by predicted step time are in their measured order."
    noise = [(a, b) for a, b in swapped if abs(a[2] - b[2]) <= a[3] + b[3]]
    shown = ", ".join(f"{a[0]} / {b[0]}" + (" (within noise)" if (a, b) in noise else "")
                      for a, b in swapped[:6]) + (" ..." if len(swapped) > 6 else "")
    return (f"Order: {len(swapped)} of {len(runs) * (len(runs) - 1) // 2} pairs are predicted in the other order "
            f"than measured, {len(noise)} of them within the measured spread: {shown}.")


def prediction_plot(table: Table, path: Path) -> Path:
    """Predicted against measured step time, log-log, the y = x line and the ±TOLERANCE band."""
    import matplotlib.pyplot as plt

    from launcher.report.plots import MARKERS, save_png

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for i, row in enumerate(table.rows):
        ax.errorbar(row[2], row[1], xerr=row[3], marker=MARKERS[i % len(MARKERS)], label=row[0], zorder=3)
    values = [v for row in table.rows for v in (row[1], row[2])]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    ax.fill_between([lo, hi], [lo * (1 - TOLERANCE), hi * (1 - TOLERANCE)],
                    [lo * (1 + TOLERANCE), hi * (1 + TOLERANCE)], color="grey", alpha=0.2, label=f"±{TOLERANCE:.0%}")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (s)",
           ylabel="predicted step (s)", title="Step time: predicted vs measured")
    ax.legend(fontsize=6)
    return save_png(fig, path)
