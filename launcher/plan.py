"""action=plan: every run's layout, resources and sbatch script, printed and saved to plan.json."""
from __future__ import annotations

import json

from train.spec import write_atomic

from .settings import Settings
from .store import Store
from .submit import attempt_folder, resources, sbatch_text
from .sweep import Run, expand


def entry(settings: Settings, run: Run) -> dict:
    spec, cluster = run.spec, settings.cluster
    attempt = Store(settings.sweep_dir).entries.get(run.run_id, {}).get("attempts", 0) + 1
    folder = attempt_folder(settings.sweep_dir / run.run_id, attempt)
    return {
        "run_id": run.run_id, "strategy": spec.strategy, "F": spec.F, "R": spec.R, "S": spec.S, "A": spec.A,
        "world_size": spec.world_size, "nodes": run.nodes, "gpus_per_node": cluster.gpus_per_node,
        "model": spec.model, "train": {k: getattr(spec.train, k) for k in ("steps", "seq_len", "batch_per_rank",
                                                                            "lr", "precision")},
        "note": run.note, "resources": resources(cluster, run),
        "sbatch": sbatch_text(cluster, run, folder) if cluster.executor == "slurm" else None,
    }


def plan(settings: Settings) -> list[dict]:
    entries = [entry(settings, run) for run in expand(settings)]
    path = settings.sweep_dir / "plan.json"
    write_atomic(path, json.dumps({"sweep": settings.sweep.name, "cluster": settings.cluster.name,
                                   "runs": entries}, indent=2) + "\n")
    print(f"sweep {settings.sweep.name} on cluster {settings.cluster.name}: {len(entries)} run(s)")
    for e in entries:
        A = f" A={e['A']}" if e["A"] else ""
        print(f"  {e['run_id']:<28} (F,R,S)=({e['F']},{e['R']},{e['S']}){A} ranks={e['world_size']} "
              f"nodes={e['nodes']} model={e['model'].get('preset', 'custom')} {e['note']}".rstrip())
    print(f"plan written to {path}")
    return entries
