"""ppl_vs_time.png and phases.png from a sweep's results and metrics.jsonl files; eval_vs_time.png from the
results' evaluation histories when runs evaluated during training (train.eval_every), and speed_vs_quality.png
(throughput against final perplexity, the Pareto front drawn) when the runs learned that far."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # cluster nodes have no display
import matplotlib.pyplot as plt  # noqa: E402

from launcher.report.results import group_repeats  # noqa: E402
from launcher.report.tables import paper_order  # noqa: E402
from train.contract.common import atomic  # noqa: E402
from train.contract.result import PHASES, RunResult  # noqa: E402


def save_png(fig, path: Path) -> Path:
    try:
        with atomic(path) as tmp:
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "x")


def line_style(i: int) -> dict:
    """The i-th run's line: its own dash pattern and marker (and, from matplotlib, its colour), so runs that
    measured the same perplexities stay visible on top of each other (FSDP under HSDP, say)."""
    return {"linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)],
            "markevery": 0.1, "markersize": 4, "alpha": 0.85, "linewidth": 1.2 + 1.2 * (i == 0)}


def plots(sweep_dir: Path, results: list[RunResult]) -> list[Path]:
    """ppl_vs_time.png (train perplexity per step vs wall time, floor dashed) and phases.png (mean step, stacked)."""
    sweep_dir, results = Path(sweep_dir), sorted(results, key=lambda r: paper_order(vars(r)))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        path = sweep_dir / r.run_id / "metrics.jsonl"
        steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        if steps:
            style = line_style(len(ax.lines))
            ax.plot([s["elapsed_s"] for s in steps], [s["ppl"] for s in steps], label=r.run_id, **style)
    floor_line(ax, results)
    ax.set(yscale="log", xlabel="elapsed (s)", ylabel="train perplexity", title="Train perplexity vs wall time")
    if ax.lines:
        ax.legend(fontsize=7)
    written = [save_png(fig, sweep_dir / "ppl_vs_time.png")]

    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(results)), 4.5))
    x = list(range(len(results)))
    bottom = [0.0] * len(results)
    for phase in PHASES:
        heights = [r.phases[phase].mean or 0.0 for r in results]  # Table 4's per-step means
        ax.bar(x, heights, bottom=bottom, label=phase, edgecolor="black", linewidth=0.4,
               hatch="//" if phase == "aggregation" else None)  # a thin aggregation slice stays visible
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(x, [r.run_id for r in results], rotation=30, ha="right", fontsize=7)
    ax.set(xlabel="run", ylabel="seconds per step", title="Mean step by phase (as Table 4: aggregation per step)")
    ax.legend(fontsize=7)
    written.append(save_png(fig, sweep_dir / "phases.png"))
    if any(len(r.eval_history) > 1 for r in results):
        written.append(eval_plot(results, sweep_dir / "eval_vs_time.png"))
        written.append(front_plot(results, sweep_dir / "speed_vs_quality.png"))
    return written


FLOOR_REACH = 3.0  # the floor is drawn when the curves come within this factor of it


def floor_line(ax, results: list[RunResult]) -> None:
    """The data's floor perplexity, one labelled line for all seeds' floors (their range in the label); where the
    curves stay far above it, a note in the corner instead, so a line near the axis does not squash them."""
    floors = sorted({r.floor_ppl for r in results if r.floor_ppl is not None})
    if not floors:
        return
    label = f"floor {floors[0]:.2f}" + (f"–{floors[-1]:.2f}" if len(floors) > 1 else "")
    lowest = min((min(line.get_ydata()) for line in ax.lines if len(line.get_ydata())), default=floors[0])
    if lowest <= FLOOR_REACH * floors[-1]:
        ax.axhline(floors[0], linestyle="--", color="grey", label=label)
    else:
        ax.text(0.99, 0.02, f"{label}: far below these curves", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=7, color="grey")


PPL_TIE = 0.005  # perplexities within 0.5 % count as equal: FSDP and HSDP compute the same model, and a
                 # last-digit difference must not put the slower one on the front


def pareto_front(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """(throughput, perplexity, label) points no other point beats on both (faster and at least as good, perplexities
    within PPL_TIE counting as equal), fastest first: the layouts a user picks from."""
    front, best = [], float("inf")
    for point in sorted(points, key=lambda p: (-p[0], p[1])):
        if point[1] < best * (1 - PPL_TIE):
            front.append(point)
            best = point[1]
    return front


def front_plot(results: list[RunResult], path: Path) -> Path:
    """Throughput against final eval perplexity, a point per run (repeats averaged), the Pareto front joined."""
    points = [(row["tokens_per_s"], row["eval_ppl"], row["run_id"]) for row in group_repeats(results)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (x, y, label) in enumerate(points):
        ax.plot([x], [y], linestyle="none", marker=MARKERS[i % len(MARKERS)], label=label)
    front = pareto_front(points)
    ax.plot([p[0] for p in front], [p[1] for p in front], color="black", linewidth=1,
            label=f"Pareto front (perplexities within {PPL_TIE:.1%} tie)")
    ax.set(xlabel="throughput (tokens/s)", ylabel="final eval perplexity",
           title="Speed against quality (lower right is better)")
    ax.legend(fontsize=6, ncol=2)
    return save_png(fig, path)


def eval_plot(results: list[RunResult], path: Path) -> Path:
    """Eval perplexity against training time (evaluations excluded), a line per run, floor and targets drawn."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, r in enumerate(results):
        if r.eval_history:
            ax.plot([t for _, t, _ in r.eval_history], [p for _, _, p in r.eval_history], label=r.run_id,
                    **{**line_style(i), "markevery": 1})
    floor_line(ax, results)
    for target in sorted({r.target_ppl for r in results if r.target_ppl is not None}):
        ax.axhline(target, linestyle=":", color="black", label=f"target {target:.2f}")
    ax.set(yscale="log", xlabel="training time (s, evaluations excluded)", ylabel="eval perplexity",
           title="Eval perplexity vs training time")
    ax.legend(fontsize=7)
    return save_png(fig, path)
