"""action=report and the end of action=run: every table (.md/.csv/.tex) and plot of a sweep, written
atomically into its directory, with the cost model's prediction, the step-time model's predicted vs measured
step (prediction.md/.csv/.png) and the achieved placement beside them."""
from __future__ import annotations

import json
from pathlib import Path

from launcher import scheduler as schedulers
from launcher.placement import topology
from launcher.records import registry, target
from launcher.records.store import Store
from launcher.report.plots import plots
from launcher.report.prediction import prediction_plot, prediction_table
from launcher.report.prediction_parts import parts_table
from launcher.report.results import group_repeats
from launcher.report.scaling import scaling_plot, scaling_table
from launcher.report.tables import Table, table3, table4
from launcher.report.verify import placement_rows
from train.contract.common import StateError, write_atomic
from train.contract.result import RunResult

LOCAL_NOTE = ("cluster=local: every rank ran on this one machine, with no slow link between its virtual nodes, so "
              "the speed ratios do not test the paper's claim (which is about slow links between nodes); the SLURM "
              "testbed (cluster=testbed, docs/testbed.md) has shaped links and does.")


def notes_for(cluster) -> list[str]:
    """What a reader of this cluster's tables must know to not misread them."""
    return [LOCAL_NOTE] if schedulers.of(cluster).runs_here else []


def write_report(sweep_dir: Path, results: list[RunResult], cluster=None,
                 scaling: str = "none") -> tuple[str, list[Path]]:
    """Write table3/table4 (and, where placement means something, the achieved placement; for a weak or strong
    `scaling` sweep, the scaling table) as .md/.csv/.tex and the plots; return the markdown and every file written.
    `cluster`'s notes go under Table 3 (notes_for); on a local cluster every rank ran on this machine, so no
    placement table is written."""
    sweep_dir = Path(sweep_dir)
    if not results:
        before = sweep_dir.parent.parent / sweep_dir.name  # <results_dir>/<sweep>, the layout before clusters
        moved = (f"; {before} holds a sweep from before directories were keyed by cluster: move it to {sweep_dir}"
                 if (before / "manifest.jsonl").exists() else "")
        raise StateError(f"no results under {sweep_dir}{moved}")
    results = target.judged(sweep_dir, results)  # the reference runs, against the target declared from them
    plan_path = sweep_dir / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.exists() else {"runs": []}
    # the cost model's prediction beside each measurement
    predicted = {e["run_id"]: e["predicted_ratio_to_fsdp"] for e in plan["runs"]}
    tables = {"table3": table3(results, predicted), "table4": table4(results)}
    tables["table3"].notes += notes_for(cluster) if cluster is not None else []
    manifest = Store(sweep_dir).entries
    registered = registry.load(sweep_dir, [r.run_id for r in results])
    steps = prediction_table(results, plan, registered,
                             next((e["rank_order"] for e in manifest.values() if "rank_order" in e), None))
    if steps is not None:
        tables["prediction"] = steps
        parts = parts_table(group_repeats(results), {r.run_id: r for r in results}, registered)
        if parts is not None:
            tables["prediction_parts"] = parts
    topo_path = sweep_dir / "topology.json"
    local = cluster is not None and schedulers.of(cluster).runs_here
    if topo_path.exists() and not local:  # saved at submission: check where the ranks really ran
        columns, rows = placement_rows(results, topology.from_json(json.loads(topo_path.read_text())))
        tables["placement"] = Table("Placement achieved (slowest link per level, from where ranks ran)",
                                    columns, rows, ["text", *["fixed"] * (len(columns) - 2), "text"])
    if scaling != "none":
        tables["scaling"] = scaling_table(results, scaling, cluster)
    written = []
    for name, table in tables.items():
        for ext, text in (("md", table.to_markdown()), ("csv", table.to_csv()), ("tex", table.to_latex())):
            write_atomic(sweep_dir / f"{name}.{ext}", text)
            written.append(sweep_dir / f"{name}.{ext}")
    written += plots(sweep_dir, results)
    if steps is not None:
        written.append(prediction_plot(steps, sweep_dir / "prediction.png"))
    if scaling != "none":
        written.append(scaling_plot(results, scaling, sweep_dir / "scaling.png"))
    return "\n".join(t.to_markdown() for t in tables.values()), written


def outputs(sweep_dir: Path, written: list[Path]) -> str:
    """Where everything is, for the last lines a user reads."""
    sweep_dir = Path(sweep_dir)
    beside = [name for name in ("plan.json", "topology.json", "manifest.jsonl", "command.txt", "probe.json",
                                "target.json") if (sweep_dir / name).exists()]
    return (f"outputs in {sweep_dir}/: {', '.join(p.name for p in written)}"
            + (f"; {', '.join(beside)}" if beside else "")
            + "; per run: <run_id>/result.json, metrics.jsonl, evals.jsonl, spec.json, prediction.json (registered "
              "before it ran), submitit/ (job logs)")
