"""Where runs really ran: achieved per-level bottlenecks from each result's rank -> node map.

A plan is a prediction; SLURM may place differently (in-job mode) or a user may run by hand.
Each result records every rank's node; with the topology saved at submission we recompute
B_S, B_R, B_F (and B_T, B_P under tensor or pipeline parallelism) and flag runs whose placement broke
B_T >= B_P >= B_S >= B_R >= B_F.
"""
from __future__ import annotations

from launcher.placement import allocate
from launcher.placement.topology import Topology
from train.contract.layout import Layout
from train.contract.result import RunResult


def achieved(result: RunResult, topo: Topology) -> dict:
    """{B_T, B_P, B_S, B_R, B_F, hierarchy_ok} in bytes/s, or {"unverifiable": reason} when nodes are not in the
    topology."""
    by_rank = {r.rank: r.where for r in result.ranks}
    if len(by_rank) < result.world_size:
        return {"unverifiable": f"{result.world_size - len(by_rank)} rank(s) left no record (a federation group "
                                f"left out)"}
    hosts = [by_rank[k] for k in range(result.world_size)]
    outside = sorted({h for h in hosts if h not in topo.parent})
    if outside:
        return {"unverifiable": f"ran on {', '.join(outside[:3])}, not in the topology"}
    layout = Layout(result.strategy, result.F, result.R, result.S, result.A, result.pp, result.tp)
    p = allocate.assess(layout, hosts, topo)
    return {**p.bandwidth, "hierarchy_ok": p.hierarchy_ok}


def placement_rows(results: list[RunResult], topo: Topology) -> tuple[list[str], list[list]]:
    """One row per run; the tensor- and pipeline-parallel links (B_T, B_P) get columns when a run has tp or pp
    above 1, so sweeps without them keep their tables."""
    model_parallel = any(r.tp * r.pp > 1 for r in results)
    keys = [k for k in allocate.HIERARCHY if model_parallel or k not in ("B_T", "B_P")]
    columns = ["Run", *[f"{k} (GB/s)" for k in keys], " >= ".join(keys)]
    rows = []
    for result in sorted(results, key=lambda r: r.run_id):
        got = achieved(result, topo)
        if "unverifiable" in got:
            rows.append([result.run_id, *[None] * len(keys), f"unknown ({got['unverifiable']})"])
        else:
            rows.append([result.run_id, *[None if got[k] is None else got[k] / 1e9 for k in keys],
                         "ok" if got["hierarchy_ok"] else "BROKEN"])
    return columns, rows
