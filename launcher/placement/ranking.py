"""Rank (strategy, F, R, A) choices for a cluster and model by predicted communication per step.

Every candidate is placed on the cluster's topology (allocate.place) and priced with the
paper's cost model at the bottlenecks that placement achieves and, given a step-time function
(launcher.prediction), by predicted step time, which then orders them.
"""
from __future__ import annotations

from launcher.placement import allocate
from launcher.placement.costmodel import Model, predict
from launcher.placement.topology import Topology

AS = (1, 2, 4, 8, 16, 32)


def candidates(nodes: int, G: int, As=AS) -> list[tuple]:
    """The paper's layout shapes on `nodes` nodes of G GPUs: (strategy, F, R, S, A)."""
    out = [("fsdp", 1, 1, nodes * G, None)]
    if nodes > 1:
        out += [("hsdp", 1, nodes, G, None)] + [("fl_fsdp", nodes, 1, G, A) for A in As]
        out += [("fl_hsdp", F, nodes // F, G, A) for F in range(2, nodes) if nodes % F == 0 for A in As]
    return out


def price(strategy: str, F: int, R: int, S: int, A, G: int, model: Model, topo: Topology,
          usable: list[str] | None = None) -> tuple[allocate.Placement, float]:
    placement = allocate.place(F, R, S, G, topo, usable)
    return placement, predict(strategy, F, R, S, A, model, placement.bandwidth)["predicted_comm_s"]


def rank_layouts(nodes: int, G: int, model: Model, topo: Topology, usable: list[str] | None = None,
                 As=AS, step=None) -> list[dict]:
    """Fastest first by `step((strategy, F, R, S, A), placement)` seconds when given, else cheapest communication;
    ratio_to_fsdp = this layout's communication / FSDP's on the same nodes (< 1: less than FSDP),
    speedup_over_fsdp = FSDP's predicted step / this layout's."""
    usable = topo.usable() if usable is None else usable
    rows = []
    for strategy, F, R, S, A in candidates(nodes, G, As):
        placement, seconds = price(strategy, F, R, S, A, G, model, topo, usable)
        rows.append({"strategy": strategy, "F": F, "R": R, "S": S, "A": A, "predicted_comm_s": seconds,
                     **placement.bandwidth, "hierarchy_ok": placement.hierarchy_ok})
        if step is not None:
            rows[-1]["predicted_step_s"] = step((strategy, F, R, S, A), placement)
    fsdp = rows[0]
    for row in rows:
        row["ratio_to_fsdp"] = row["predicted_comm_s"] / fsdp["predicted_comm_s"] if fsdp["predicted_comm_s"] else None
        if step is not None:
            row["speedup_over_fsdp"] = (fsdp["predicted_step_s"] / row["predicted_step_s"]
                                        if row["predicted_step_s"] else None)
    return sorted(rows, key=lambda row: row["predicted_step_s" if step is not None else "predicted_comm_s"])
