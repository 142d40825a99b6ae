"""retry_shrink: a run whose nodes went down or drained resumes, from its last checkpoint (train.elastic), on
the largest layout of its strategy that the nodes left hold. The manifest records every change (`shrunk`),
so a later invocation resubmits the run on its shrunk layout rather than refusing its checkpoints."""
from __future__ import annotations

from launcher.placement import allocate
from launcher.sweep import Run
from train.contract.common import ConfigError
from train.contract.layout import Layout
from train.contract.spec import RunSpec


class ShrinkError(ConfigError):
    """The nodes left cannot hold the run's strategy (an FL run below F = 2, or no node at all)."""


def check(runs: list[Run]) -> None:
    """retry_shrink resumes from a checkpoint: refuse, before anything is submitted, runs that write none."""
    bare = [r.run_id for r in runs if not r.spec.train.checkpoint_every]
    if bare:
        raise ConfigError(f"retry_shrink=true needs checkpoints to resume from, but {bare[0]} has "
                          f"train.checkpoint_every=0" + (f" ({len(bare) - 1} more run(s) too)" if len(bare) > 1 else "")
                          + ": set train.checkpoint_every=K")
    split = [r.run_id for r in runs if r.spec.layout.T * r.spec.layout.P > 1]
    if split:
        raise ConfigError(f"retry_shrink=true resumes on fewer nodes by changing F, R or S, which a run with "
                          f"train.tp or train.pp > 1 ({split[0]}) cannot do yet: set retry_shrink=false")


def layout_on(spec: RunSpec, nodes: int, G: int) -> Layout:
    """The largest layout of the run's strategy on `nodes` nodes of G GPUs: FSDP shards over them all, HSDP
    keeps S and replicates over them, an FL run keeps its federation groups' shape and drops groups (they are
    loosely coupled: the remaining ones continue from the federation's last average)."""
    L = spec.layout
    if nodes < 1:
        raise ShrinkError(f"{spec.run_id}: no usable node is left to resume on")
    if not L.federated:  # FSDP shards over every GPU left; HSDP keeps its shard group and replicates it
        return L.regrid(1, max(1, nodes * G // L.S), L.S) if L.row.replicated else L.regrid(1, 1, nodes * G)
    F = min(L.F, nodes * G // (L.R * L.S))
    while F >= 2 and not _packs(L.regrid(F, L.R, L.S), G):
        F -= 1
    if F < 2:
        raise ShrinkError(f"{spec.run_id}: the {nodes} usable node(s) left hold {F} federation group(s) of "
                          f"{L.R * L.S} ranks, and an FL run cannot shrink below F=2; not resubmitted")
    return L.regrid(F, L.R, L.S)


def _packs(layout: Layout, G: int) -> bool:
    try:
        allocate.units(layout, G)
    except ConfigError:
        return False
    return True


def resized(run: Run, layout: Layout, G: int, note: str) -> Run:
    """`run` on another layout of its strategy, resuming elastically in the same directory under the same run id
    (the spec keeps its config and repeat). An injected fault (train.fault_step) is not carried: its group may not
    exist on fewer nodes, and the loss that made the run shrink is the fault it measures."""
    raw = run.spec.to_dict()
    raw.update(F=layout.F, R=layout.R, S=layout.S, train={**raw["train"], "elastic": True, "fault_step": 0})
    per_unit, units = allocate.units(layout, G)
    return Run(spec=RunSpec.from_dict(raw), nodes=per_unit * units, note=note)


def change(run: Run, to: Run, attempt: int, lost: list[str]) -> dict:
    """The manifest's record of one shrink."""
    return {"attempt": attempt, "lost": lost, "from": _layout(run), "to": _layout(to)}


def _layout(run: Run) -> dict:
    L = run.spec.layout
    return {"F": L.F, "R": L.R, "S": L.S, "nodes": run.nodes}


def as_recorded(run: Run, entry: dict, G: int) -> Run:
    """The run as its latest recorded shrink left it (unchanged when it never shrank)."""
    if not entry.get("shrunk"):
        return run
    last = entry["shrunk"][-1]["to"]
    return resized(run, run.spec.layout.regrid(last["F"], last["R"], last["S"]), G,
                   f"shrunk to {last['nodes']} node(s) earlier")
