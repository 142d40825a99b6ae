"""Rank (strategy, F, R, A, pp, tp) choices for a cluster and model by predicted communication per step.

Every candidate is placed on the cluster's topology (allocate.place) and priced with the
paper's cost model at the bottlenecks that placement achieves and, given a step-time function
(launcher.prediction), by predicted step time, which then orders them; given a memory function and the
devices' capacity, the layouts that do not fit come last, marked.
"""
from __future__ import annotations

from launcher.placement import allocate
from launcher.placement.costmodel import Model, predict
from launcher.placement.topology import Topology
from train.contract.layout import STRATEGIES, Layout

AS = (1, 2, 4, 8, 16, 32)


def candidates(nodes: int, G: int, As=AS, parallel=((1, 1),)) -> list[Layout]:
    """The paper's layout shapes on `nodes` nodes of G GPUs, for each (pp, tp) in `parallel`. A shard of pp x tp
    GPUs leaves G / (pp x tp) shards per node, or spans (pp x tp) / G nodes."""
    out = []
    for P, T in parallel:
        grid = allocate.shards_per_node(nodes, G, P, T)
        if grid is None:
            continue
        n, g = grid
        out += [Layout(name, *grid, P=P, T=T) for name, row in STRATEGIES.items() for grid in row.candidates(n, g, As)]
    return out


def price(layout: Layout, G: int, model: Model, topo: Topology,
          usable: list[str] | None = None) -> tuple[allocate.Placement, float]:
    placement = allocate.place(layout, G, topo, usable)
    return placement, predict(layout, model, placement.bandwidth)["predicted_comm_s"]


def rank_layouts(layouts: list[Layout], G: int, model: Model, topo: Topology, usable: list[str] | None = None,
                 step=None, memory=None, capacity: float | None = None) -> list[dict]:
    """Fastest first by `step(layout, placement)` seconds when given, else cheapest
    communication; ratio_to_fsdp = this layout's communication / FSDP's on the same nodes (< 1: less than FSDP),
    speedup_over_fsdp = FSDP's predicted step / this layout's (FSDP: the first of `layouts`, as `candidates`
    lists them).
    `memory(layout)`: bytes per device; with `capacity`, layouts above it are marked and ranked last."""
    usable = topo.usable() if usable is None else usable
    rows = []
    placed: dict[tuple, allocate.Placement] = {}  # candidates that differ only in strategy or A share a placement
    for layout in layouts:
        F, R, S, P, T = layout.F, layout.R, layout.S, layout.P, layout.T
        if (F, R, S, P, T) not in placed:
            placed[F, R, S, P, T] = allocate.place(layout, G, topo, usable)
        placement = placed[F, R, S, P, T]
        seconds = predict(layout, model, placement.bandwidth)["predicted_comm_s"]
        rows.append({"strategy": layout.strategy, "F": F, "R": R, "S": S, "A": layout.A, "pp": P, "tp": T,
                     "predicted_comm_s": seconds, **placement.bandwidth, "hierarchy_ok": placement.hierarchy_ok})
        if step is not None:
            rows[-1]["predicted_step_s"] = step(layout, placement)
        if memory is not None:
            rows[-1]["memory_per_device_bytes"] = memory(layout)
            rows[-1]["fits"] = capacity is None or rows[-1]["memory_per_device_bytes"] <= capacity
    fsdp = rows[0]
    for row in rows:
        row["ratio_to_fsdp"] = row["predicted_comm_s"] / fsdp["predicted_comm_s"] if fsdp["predicted_comm_s"] else None
        if step is not None:
            row["speedup_over_fsdp"] = (fsdp["predicted_step_s"] / row["predicted_step_s"]
                                        if row["predicted_step_s"] else None)
    key = "predicted_step_s" if step is not None else "predicted_comm_s"
    return sorted(rows, key=lambda row: (not row.get("fits", True), row[key]))
