"""Which ranks talk across which topology level: the communicators the probe times (launcher.actions.probe), and how
many of a layout's concurrent communicators share the busiest link of the level they cross (the step-time
model divides a link's measured bandwidth by that count)."""
from __future__ import annotations

from launcher.placement.topology import Topology


def level_groups(hosts: list[str], parent: dict[str, str], level: dict[str, int]) -> dict[str, list[list[int]]]:
    """Rank groups that communicate across each topology level, for ranks on `hosts` (rank -> node) under
    the switch tree (`parent`, `level` as in placement.topology.Topology):
    - "node": the ranks of one node, for every node;
    - "leaf" (level 0), "spine" (level 1), "level<k>": under every switch of that level, the ranks in the same
      position of one node per child (node or switch), so the communicator crosses that level's links and
      every position communicates at once, as data-parallel groups do. Only the most common group size is
      kept per level, so one (level, collective) has one communicator size."""
    by_node: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_node.setdefault(host, []).append(rank)
    out: dict[str, list[list[int]]] = {}
    if any(len(r) > 1 for r in by_node.values()):
        out["node"] = [ranks for ranks in by_node.values() if len(ranks) > 1]
    for lv in sorted(set(level.values())):
        groups = []
        for switch in (s for s, sl in level.items() if sl == lv):
            first: dict[str, str] = {}  # child of `switch` -> the first node below it
            for node in by_node:
                chain = [node]
                while chain[-1] in parent and chain[-1] != switch:
                    chain.append(parent[chain[-1]])
                if chain[-1] == switch and len(chain) > 1:
                    first.setdefault(chain[-2], node)
            if len(first) > 1:
                width = min(len(by_node[n]) for n in first.values())
                groups += [[by_node[n][j] for n in first.values()] for j in range(width)]
        if groups:
            size = max({len(g) for g in groups}, key=[len(g) for g in groups].count)
            out[level_name(lv)] = [g for g in groups if len(g) == size]
    return out


def level_name(lv: int) -> str:
    """The probe's name of a topology level: node (-1, inside one node), leaf (0), spine (1), level<k>."""
    return {-1: "node", 0: "leaf", 1: "spine"}.get(lv, f"level{lv}")


def traffic(groups: list[list[str]], topo: Topology) -> dict[int, int]:
    """{level: flows} for communicators that run at once, each given by its members' hosts in rank order: for
    every level a group crosses, the most flows on one link of it. A ring runs through the members in rank
    order, so it crosses a child's link up to a switch once each way for every two boundaries between members
    inside and outside the child, taken cyclically: SLURM's order (tb1 tb2 tb3 tb4 across two leaves) takes an
    8-rank ring over each trunk twice each way, the topology's order once. Level -1 counts groups that stay
    inside one node, per node. Linear in members times tree depth, so 100k-node plans stay fast."""
    load: dict[tuple[int, str], int] = {}
    chains: dict[str, list[str]] = {}
    for hosts in (g for g in groups if len(g) > 1):
        if len(set(hosts)) == 1:
            load[(-1, hosts[0])] = load.get((-1, hosts[0]), 0) + 1
            continue
        for child, flows in _ring_crossings(hosts, topo, chains).items():
            key = (topo.level[topo.parent[child]], child)
            load[key] = load.get(key, 0) + flows
    out: dict[int, int] = {}
    for (lv, _), n in load.items():
        out[lv] = max(out.get(lv, 0), n)
    return out


def _ring_crossings(hosts: list[str], topo: Topology, chains: dict[str, list[str]]) -> dict[str, int]:
    """{child: times a ring through `hosts`, in order, crosses the child's uplink one way}: each step of the ring
    from a to b leaves every child on a's side below their lowest common switch and enters every one on b's."""
    boundaries: dict[str, int] = {}
    for a, b in zip(hosts, hosts[1:] + hosts[:1]):
        if a == b:
            continue
        ca = chains.setdefault(a, [a, *topo.ancestors(a)])
        cb = chains.setdefault(b, [b, *topo.ancestors(b)])
        common = set(ca) & set(cb)
        for chain in (ca, cb):
            for child in chain:
                if child in common:
                    break
                boundaries[child] = boundaries.get(child, 0) + 1
    return {child: n // 2 for child, n in boundaries.items() if n // 2}
