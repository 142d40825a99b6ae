"""action=plan: the sweep's plan (launcher.planning) written beside its runs (plan.json, topology.json, ranking.md
and each SLURM run's sbatch script) and printed: every run's layout, placement, predicted communication (the
paper's model), step time, memory and dry-run, then the fastest layouts."""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from launcher import fault_tolerance
from launcher import scheduler as schedulers
from launcher.actions import dryrun
from launcher.placement.memory import human_bytes
from launcher.planning import GB, Plan, PlanEntry, comm_model, make_plan, model_sent_bytes, node_share
from launcher.prediction import TOLERANCE
from launcher.records.registry import model_name
from launcher.records.store import Store
from launcher.report.tables import oriented
from launcher.settings import Settings
from launcher.sweep import PlannedRun, Run, expand
from train.contract.common import write_atomic
from train.contract.layout import Layout


def plan(settings: Settings, runs: list[Run] | None = None,
         echo: bool = True) -> tuple[list[PlannedRun], list[PlanEntry]]:
    """Place and price every run (make_plan), dry-run them when asked, write the plan's files and, with `echo`,
    print it (action=plan; action=run keeps the files for the report and submits the placed runs returned)."""
    runs = expand(settings) if runs is None else runs
    store = Store(settings.sweep_dir)  # a malformed manifest stops the plan before anything is written
    out = output_dir(settings, store)
    made = make_plan(settings, runs, store.entries)
    if settings.action == "dryrun" or settings.plan.dryrun:
        print(f"dry-run of {len(made.entries)} run(s) on fake tensors at their real world size "
              f"(launcher.actions.dryrun):")
        measured = dryrun.dryrun(settings, runs, {e.run_id: e.memory["model_bytes"] for e in made.entries},
                                 {run.run_id: model_sent_bytes(run) for run in runs}, out)
        made = replace(made, entries=[replace(e, memory=measured[e.run_id]) for e in made.entries])
    path, scripts = write(settings, made, out)
    if echo:
        print("\n".join(lines(settings, runs, made, scripts)))
        if out != settings.sweep_dir:
            print(f"this sweep has runs (manifest.jsonl), so its plan.json stays as it is: this plan went to {out}")
        print(f"plan written to {path}")
    return made.planned, made.entries


def write(settings: Settings, made: Plan, out: Path) -> tuple[Path, list[Path]]:
    """topology.json, plan.json, the sbatch scripts and ranking.md into `out`; (plan.json, the scripts)."""
    from launcher.placement import topology

    write_atomic(out / "topology.json", json.dumps(topology.to_json(made.topology)) + "\n")
    path = out / "plan.json"
    write_atomic(path, json.dumps({"sweep": settings.sweep.name, "cluster": settings.cluster.name,
                                   "topology": made.source, "network": made.network, "nodes": made.nodes,
                                   "runs": [e.to_json() for e in made.entries],
                                   "ranking": made.ranking}, indent=2) + "\n")
    scripts = write_scripts(out, made.entries)
    capacity = settings.cluster.gpu_memory_GB
    write_atomic(out / "ranking.md", ranking_table(
        made.ranking, made.widest.nodes, settings.cluster.gpus_per_node, capacity,
        f"`action=plan` of sweep {settings.sweep.name} on cluster {settings.cluster.name} ({made.source}): the "
        f"step-time model with {made.network}, compute {made.compute_sources}; memory per device from "
        f"launcher/placement/memory.py" + (f" against {capacity:g} GB" if capacity else "") + "."))
    return path, scripts


def lines(settings: Settings, runs: list[Run], made: Plan, scripts: list[Path]) -> list[str]:
    """The plan as action=plan prints it: what the sweep trains, the nodes, a row per run, the fastest layouts,
    the first sbatch script."""
    entries, nodes = made.entries, made.nodes
    out = [f"sweep {settings.sweep.name} on cluster {settings.cluster.name} ({made.source}): {len(entries)} run(s)"]
    out += [f"  {line}" for line in header(settings, runs)
            + schedulers.of(settings.cluster).job_environment(settings.results_dir)]
    if settings.cluster.device == "cuda" and not settings.cluster.gpu_memory_GB:
        out.append("  WARNING: memory per device NOT checked: cluster.gpu_memory_GB is null (unknown), so no layout is "
                   "refused for not fitting: set it to your GPUs' memory in GB (e.g. cluster.gpu_memory_GB=80 for "
                   "an H100 80 GB)")
    if nodes["excluded"] or nodes["note"]:
        why = "; ".join(f"{n} {reason} ({', '.join(nodes['examples'][reason])}{', ...' if n > 3 else ''})"
                        for reason, n in nodes["excluded"].items())
        gpus, cpus = node_share(settings.cluster)
        out.append(f"  nodes: {nodes['free']} with one node's share free ({gpus} GPUs, {cpus} CPUs)"
                   + (f"; excluded: {why}" if why else "") + (f"; {nodes['note']}" if nodes["note"] else ""))
    out += run_rows(entries)
    out += fault_tolerance.priced(entries, runs, settings.cluster)
    out.append(f"  paper comm and less comm: the paper's formulas at nominal bandwidth; compute, comm, step, tokens/s "
               f"and faster: the step-time model ({'full' if settings.cluster.device == 'cuda' else 'no'} "
               f"compute/communication overlap) with {made.network}, compute {made.compute_sources}")
    out.append(f"fastest layouts on {made.widest.nodes} nodes (predicted step time):")
    for row in made.ranking[:5]:
        comm = (f"comm {oriented(1 / row['ratio_to_fsdp'], 'more', 'less')} than FSDP" if row["ratio_to_fsdp"]
                else "no traffic in the paper's formulas (which price no tensor or pipeline traffic)")
        out.append(f"  {layout_name(row)}: {row['predicted_step_s']:.3g} s/step, "
                   f"{oriented(row['speedup_over_fsdp'], 'slower', 'faster')} than FSDP; {comm}; "
                   f"{human_bytes(row['memory_per_device_bytes'])} per device"
                   + ("" if row["fits"] else " (does NOT fit)"))
    close = close_to_best(made.ranking)
    if close > 1:
        out.append(f"  no clear winner: the {close} fastest layouts are within ±{TOLERANCE:.0%} of the fastest, the "
                   f"step-time model's target tolerance (action=validate measures how it does)")
    if scripts:
        out.append(f"sbatch scripts: {len(scripts)} in {scripts[0].parent}; the first, {scripts[0].name}:")
        out.append(scripts[0].read_text().rstrip())
    return out


def run_rows(entries: list[PlanEntry]) -> list[str]:
    """The table of runs: placement, the paper's communication, the step-time model, checkpoint and memory."""
    width = max(28, *(len(e.run_id) for e in entries))
    out = [f"  {'run':<{width}} {'ranks':>5} {'nodes':>5}  B_S/B_R/B_F GB/s     order  {'paper comm':>10} "
           f"{'less comm than FSDP':>19}  {'compute':>8} {'comm':>8} {'step (s)':>9} {'tokens/s':>9} "
           f"{'faster than FSDP':>16}  checkpoint  memory/device  dry-run"]
    for e in entries:
        bw = "/".join(_gbps(e.bandwidth[k]) for k in ("B_S", "B_R", "B_F"))
        ratio = oriented(1 / e.predicted_ratio_to_fsdp, "more") if e.predicted_ratio_to_fsdp else "-"
        speedup = oriented(e.predicted_speedup_over_fsdp, "slower") if e.predicted_speedup_over_fsdp else "-"
        compute = "?" if e.predicted_compute_s is None else f"{e.predicted_compute_s:.3g}s"
        comm = f"{sum(e.predicted_comm_by_group_s.values()):.3g}s"
        out.append(f"  {e.run_id:<{width}} {e.world_size:>5} {len(e.nodes):>5}  {bw:<20} "
                   f"{'ok' if e.hierarchy_ok else 'BROKEN':<6} {e.predicted_comm_s:>9.3g}s  {ratio:>19}  "
                   f"{compute:>8} {comm:>8} {e.predicted_step_s:>9.3g} {e.predicted_tokens_per_s:>9,.0f} "
                   f"{speedup:>16}  {human_bytes(e.checkpoint_bytes):>9}  "
                   f"{human_bytes(e.memory_per_device['total']):>12}  {_dryrun_bytes(e.memory):>7}"
                   + (f"  {e.note}" if e.note else ""))
    return out


def layout_name(row: dict) -> str:
    """A ranking row's layout as the plan prints it (Layout.label)."""
    return Layout(row["strategy"], row["F"], row["R"], row["S"], row["A"], row["pp"], row["tp"]).label


def ranking_table(ranking: list[dict], nodes: int, G: int, capacity: float | None, header: str) -> str:
    """ranking.md: every layout the plan ranked, fastest first, with its predicted step and memory per device, so
    a reader can see where each layout lands without reading plan.json."""
    lines = [f"# Every layout on {nodes} nodes of {G} GPUs, fastest first", "", header, "",
             "| # | strategy | F | R | S | A | pp | tp | predicted step (s) | faster than FSDP | memory per device |"
             + (" fits |" if capacity else ""),
             "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if capacity else "")]
    for i, row in enumerate(ranking, 1):
        speedup = "-" if row.get("speedup_over_fsdp") is None else f"{row['speedup_over_fsdp']:.3g}×"
        lines.append(f"| {i} | {row['strategy']} | {row['F']} | {row['R']} | {row['S']} | {row['A'] or '-'} | "
                     f"{row['pp']} | {row['tp']} | {row['predicted_step_s']:.4g} | {speedup} | "
                     f"{human_bytes(row['memory_per_device_bytes'])} |"
                     + ((" yes |" if row["fits"] else " **no** |") if capacity else ""))
    return "\n".join(lines) + "\n"


def close_to_best(ranking: list[dict]) -> int:
    """How many of the ranked layouts (fastest first) predict a step within TOLERANCE of the fastest: more
    than one means the prediction cannot tell them apart."""
    if not ranking or "predicted_step_s" not in ranking[0]:
        return 0
    best = ranking[0]["predicted_step_s"]
    return sum(row["predicted_step_s"] <= best * (1 + TOLERANCE) for row in ranking)


def _dryrun_bytes(memory: dict) -> str:
    """The dry-run's peak (training or after it), or '-' when none ran."""
    if memory["dryrun_peak_bytes"] is None:
        return "-"
    return human_bytes(max(memory["dryrun_peak_bytes"], memory["dryrun_after_training_bytes"]))


def _gbps(b) -> str:
    return "-" if b is None else f"{b / GB:g}"


def output_dir(settings: Settings, store: Store) -> Path:
    """Where the plan goes: the sweep's directory, except when action=plan or dryrun looks at a sweep that has runs
    (their report reads its plan.json): a plans/<time>/ directory of its own then, never replacing what ran."""
    if settings.action in ("plan", "dryrun") and store.entries:
        return settings.sweep_dir / "plans" / time.strftime("%Y%m%d-%H%M%S")
    return settings.sweep_dir


def write_scripts(out: Path, entries: list[PlanEntry]) -> list[Path]:
    """Each SLURM run's sbatch script as scripts/<run_id>.sbatch beside plan.json, to read before submitting; the
    scripts of runs this plan no longer has (an earlier plan of other layouts) are removed, so that scripts/ is
    this plan's."""
    paths = []
    for e in entries:
        if e.sbatch is not None:
            paths.append(out / "scripts" / f"{e.run_id}.sbatch")
            write_atomic(paths[-1], e.sbatch + "\n")
    for stale in sorted(set((out / "scripts").glob("*.sbatch")) - set(paths)):
        stale.unlink()
    return paths


def header(settings: Settings, runs: list[Run]) -> list[str]:
    """What the sweep trains, before how it is laid out: model, data, steps, global batch, tokens, and that
    training starts from random weights (pretraining, as the paper)."""
    def distinct(values) -> str:
        return " / ".join(dict.fromkeys(values))

    specs = [run.spec for run in runs]
    models = distinct(f"{model_name(run.spec.model.to_dict())} ({comm_model(run).params / 1e9:.3g} B parameters)"
                      for run in runs)
    data = distinct(_data_words(s.data) for s in specs)
    batch = distinct(f"{s.layout.dp_world * s.train.batch_per_rank} sequences x {s.train.seq_len} tokens"
                     for s in specs)
    tokens = distinct(f"{s.train.steps * s.layout.dp_world * s.train.batch_per_rank * s.train.seq_len / 1e6:.4g} M"
                      for s in specs)
    return [f"model: {models}, random initialisation (pretraining, as the paper; no checkpoint is loaded)",
            f"data: {data}",
            f"steps: {distinct(str(s.train.steps) for s in specs)}; global batch: {batch}; tokens per run: {tokens}"]


def _data_words(data) -> str:
    if data.kind == "synthetic":
        return (f"synthetic Markov chain (data=synthetic, branching {data.branching}; "
                f"data=tokens data.path=DIR trains on a corpus)")
    if data.kind == "tokens":
        return f"prepared tokens in {data.path}"
    return f"text files {', '.join(data.paths)} (tokenizer {data.tokenizer})"
