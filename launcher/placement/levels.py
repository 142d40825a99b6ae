"""Which ranks talk across which topology level: the communicators the probe times (launcher.probe)."""
from __future__ import annotations


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
            out[{0: "leaf", 1: "spine"}.get(lv, f"level{lv}")] = [g for g in groups if len(g) == size]
    return out
