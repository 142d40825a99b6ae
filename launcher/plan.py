"""action=plan: every run's layout, placement, predicted communication and sbatch script -> plan.json."""
from __future__ import annotations

import json

from launcher.errors import ConfigError
from launcher.placement import allocate, topology
from launcher.placement import ranking as planner
from launcher.placement.costmodel import Model, checkpoint_bytes, model_from_preset, predict
from launcher.secrets import redact, redacted
from launcher.settings import Settings
from launcher.slurm.submit import attempt_folder, require_netns, resources, sbatch_text
from launcher.store import Store
from launcher.sweep import Run, expand
from train.presets import PRESETS
from train.spec import write_atomic

GB = 1e9


def comm_model(run: Run) -> Model:
    """Bytes the cost model moves: the run's Llama shapes in its communication precision."""
    shapes = dict(run.spec.model)
    return model_from_preset({**PRESETS.get(shapes.pop("preset", None), {}), **shapes}, run.spec.train.precision,
                             run.spec.train.average_optimizer_state)


def place_runs(settings: Settings, runs: list[Run]) -> tuple[topology.Topology, str, list[str]]:
    """Place every run on the cluster's topology (plan() saves it as topology.json for jobs and reports)."""
    require_netns(settings.cluster)
    topo, source, real = topology.load(settings.cluster)
    if settings.cluster.placement == "pinned" and settings.cluster.executor == "slurm" and not real:
        raise ConfigError("cluster.placement=pinned needs the real topology: set cluster.snapshot=DIR "
                          "(slurm/capture.sh) or run where scontrol works")
    # pinned jobs name their nodes, which must be free now; in-job placement happens on what SLURM gives.
    usable = topo.usable(now=settings.cluster.placement == "pinned")
    for run in runs:
        s = run.spec
        run.placement = allocate.place(s.F, s.R, s.S, settings.cluster.gpus_per_node, topo, usable)
        if settings.cluster.executor == "slurm" and real:
            run.leaves = len({topo.parent[n] for n in run.placement.nodes})
    return topo, source, usable


def entry(settings: Settings, run: Run, topo: topology.Topology, usable: list[str], fsdp_s: dict,
          store: Store) -> dict:
    spec, cluster = run.spec, settings.cluster
    G = cluster.gpus_per_node
    model = comm_model(run)
    placement = run.placement
    predicted = predict(spec.strategy, spec.F, spec.R, spec.S, spec.A, model, placement.bandwidth)["predicted_comm_s"]
    if run.nodes not in fsdp_s:
        fsdp_s[run.nodes] = planner.price("fsdp", 1, 1, run.nodes * G, None, G, model, topo, usable)[1]
    attempt = store.entries.get(run.run_id, {}).get("attempts", 0) + 1
    folder = attempt_folder(settings.sweep_dir / run.run_id, attempt)
    return {
        "run_id": run.run_id, "strategy": spec.strategy, "F": spec.F, "R": spec.R, "S": spec.S, "A": spec.A,
        "world_size": spec.world_size, "gpus_per_node": G, "model": spec.model, "model_params": model.params,
        "train": {k: getattr(spec.train, k) for k in ("steps", "seq_len", "batch_per_rank", "lr", "precision")},
        "note": run.note, "nodes": placement.nodes, "hostfile": placement.hosts,
        "coords": [list(c) for c in placement.coords], "bandwidth": placement.bandwidth,
        "group_levels": placement.group_levels, "hierarchy_ok": placement.hierarchy_ok,
        "predicted_comm_s": predicted, "predicted_ratio_to_fsdp": predicted / fsdp_s[run.nodes] if fsdp_s[run.nodes]
        else None,
        "checkpoint_bytes": checkpoint_bytes(model.params, spec.F, spec.train.precision,
                                             spec.train.average_optimizer_state),
        "resources": redacted(resources(cluster, run)),
        "sbatch": "\n".join(map(redact, sbatch_text(cluster, run, folder).split("\n")))
        if cluster.executor == "slurm" else None,
    }


def _gbps(b) -> str:
    return "-" if b is None else f"{b / GB:g}"


def plan(settings: Settings, runs: list[Run] | None = None, echo: bool = True) -> list[dict]:
    """Place and price every run; write plan.json (action=plan prints it, action=run keeps it for the report)."""
    runs = expand(settings) if runs is None else runs
    store = Store(settings.sweep_dir)  # a malformed manifest stops the plan before anything is written
    topo, source, usable = place_runs(settings, runs)
    fsdp_s: dict = {}
    entries = [entry(settings, run, topo, usable, fsdp_s, store) for run in runs]
    widest = max(runs, key=lambda r: r.nodes)
    ranking = planner.rank_layouts(widest.nodes, settings.cluster.gpus_per_node, comm_model(widest), topo, usable)
    write_atomic(settings.sweep_dir / "topology.json", json.dumps(topology.to_json(topo)) + "\n")
    path = settings.sweep_dir / "plan.json"
    write_atomic(path, json.dumps({"sweep": settings.sweep.name, "cluster": settings.cluster.name,
                                   "topology": source, "runs": entries, "ranking": ranking}, indent=2) + "\n")
    if not echo:
        return entries
    print(f"sweep {settings.sweep.name} on cluster {settings.cluster.name} ({source}): {len(entries)} run(s)")
    print(f"  {'run':<28} {'ranks':>5} {'nodes':>5}  B_S/B_R/B_F GB/s     order  comm/step  vs FSDP  checkpoint")
    for e in entries:
        bw = "/".join(_gbps(e["bandwidth"][k]) for k in ("B_S", "B_R", "B_F"))
        ratio = f"{e['predicted_ratio_to_fsdp']:.3f}" if e["predicted_ratio_to_fsdp"] is not None else "-"
        print(f"  {e['run_id']:<28} {e['world_size']:>5} {len(e['nodes']):>5}  {bw:<20} "
              f"{'ok' if e['hierarchy_ok'] else 'BROKEN':<6} {e['predicted_comm_s']:>8.3g}s  {ratio:>7}  "
              f"{e['checkpoint_bytes'] / GB:>7.3g} GB"
              + (f"  {e['note']}" if e["note"] else ""))
    print(f"cheapest layouts on {widest.nodes} nodes (predicted communication per step):")
    for row in ranking[:5]:
        A = f" A={row['A']}" if row["A"] else ""
        print(f"  {row['strategy']:<8} (F,R,S)=({row['F']},{row['R']},{row['S']}){A}: "
              f"{row['predicted_comm_s']:.3g} s, {row['ratio_to_fsdp']:.3f} x FSDP")
    print(f"plan written to {path}")
    return entries
