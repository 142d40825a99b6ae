"""Rank placement honouring B_S > B_R > B_F: shard groups inside a node, federation groups under the lowest switch.

The ranks of one federation group are contiguous (row-major (f, r, s)), so placing a
group means choosing its nodes; rank k then runs on the (k // G)-th chosen node. Groups
are packed bottom-up: as many as possible under single leaves, then under single level-1
switches, and so on — which maximises, level by level, how many groups stay low. Among
subtrees that achieve that best profile the lowest one is used, so the federation
traffic between groups also crosses as few levels as possible.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.errors import ConfigError
from launcher.placement.topology import Topology
from train.spec import coords


class NoPlacement(ConfigError):
    """No set of usable nodes can hold the layout; the message says why and what would fit."""


@dataclass
class Placement:
    nodes: list[str]            # chosen nodes, in rank order
    hosts: list[str]            # host of every rank
    coords: list[tuple]         # (f, r, s) of every rank
    group_levels: list[int]     # lowest common switch level of each federation group (-1: one node)
    bandwidth: dict             # B_S, B_R, B_F bottlenecks in bytes/s (None where the group has one member)
    hierarchy_ok: bool

    def hostfile(self) -> str:
        """One host per line in rank order: SLURM_HOSTFILE for `srun --distribution=arbitrary`."""
        return "".join(h + "\n" for h in self.hosts)


def units(F: int, R: int, S: int, G: int) -> tuple[int, int]:
    """(nodes per packing unit, number of units): a unit is one federation group, or one node of several groups."""
    group = R * S
    if S % G and G % S:
        raise ConfigError(f"S={S} shards neither fill whole nodes of {G} GPUs nor divide one")
    if group % G == 0:
        return group // G, F
    if G % group == 0 and (F * group) % G == 0:
        return 1, F * group // G
    raise ConfigError(f"a federation group of R*S={group} ranks neither fills whole nodes of {G} GPUs "
                      f"nor packs evenly into them")


def place(F: int, R: int, S: int, G: int, topo: Topology, usable: list[str] | None = None) -> Placement:
    k, n_units = units(F, R, S, G)
    usable = topo.usable() if usable is None else usable
    if len(usable) < k * n_units:
        hint = f"; to size the sweep to them, set cluster.nodes={len(usable)}" if usable else ""
        raise NoPlacement(f"(F,R,S)=({F},{R},{S}) needs {k * n_units} nodes of {G} GPUs but only {len(usable)} "
                          f"are usable; {_what_fits(F, R, S, G, len(usable))}{hint}")
    chosen = _pack(topo, usable, k, n_units)
    if chosen is None:
        raise NoPlacement(f"(F,R,S)=({F},{R},{S}) cannot be placed on the usable nodes")
    nodes = [n for unit in chosen for n in unit]
    hosts = [nodes[rank // G] for rank in range(F * R * S)]
    return assess(F, R, S, hosts, topo, nodes=nodes)


def in_slurm_order(placement: Placement, F: int, R: int, S: int, G: int, topo: Topology) -> Placement:
    """The same nodes with ranks in SLURM's own order (cluster.placement=slurm, what the paper ran): srun's block
    distribution fills nodes in node-name order, whatever the switches they hang from (on the testbed, whose
    slurm.conf lists tb2, tb4, tb1, tb3 by leaf, `srun -N4` numbers tasks tb1, tb2, tb3, tb4)."""
    nodes = sorted(placement.nodes, key=_name_key)
    return assess(F, R, S, [nodes[rank // G] for rank in range(F * R * S)], topo, nodes=nodes)


def _name_key(node: str) -> list:
    """tb2 < tb10: digit runs compare as numbers, as SLURM's hostlists do."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", node) if part]


def communicators(F: int, R: int, S: int) -> dict[str, list[list[tuple]]]:
    """The (f, r, s) members of every shard, replicate and federation group; in FL+HSDP only replica 0 of
    each group averages across groups (train.federated)."""
    return {"shard": [[(f, r, s) for s in range(S)] for f in range(F) for r in range(R)],
            "replicate": [[(f, r, s) for r in range(R)] for f in range(F) for s in range(S)],
            "federation": [[(f, 0, s) for f in range(F)] for s in range(S)]}


def assess(F: int, R: int, S: int, hosts: list[str], topo: Topology, nodes: list[str] | None = None) -> Placement:
    """Per-level bottlenecks of a given rank -> host map (a plan, or where a finished run really ran)."""
    world = F * R * S
    grid = [coords(rank, F, R, S) for rank in range(world)]
    idx = {c: rank for rank, c in enumerate(grid)}

    def worst(groups) -> float | None:
        levels = [topo.lca_level({hosts[idx[c]] for c in group}) for group in groups if len(group) > 1]
        return topo.link(max(levels)) if levels else None

    bandwidth = {key: worst(g) for key, g in zip(("B_S", "B_R", "B_F"), communicators(F, R, S).values())}
    present = [b for b in bandwidth.values() if b is not None]
    ok = all(a >= b for a, b in zip(present, present[1:]))
    group_hosts = [{hosts[r] for r in range(f * R * S, (f + 1) * R * S)} for f in range(F)]
    return Placement(nodes=nodes or list(dict.fromkeys(hosts)), hosts=hosts, coords=grid,
                     group_levels=[topo.lca_level(h) for h in group_hosts], bandwidth=bandwidth, hierarchy_ok=ok)


def _what_fits(F: int, R: int, S: int, G: int, usable: int) -> str:
    k = max(1, R * S // G)
    groups = usable // k
    if groups >= 2:
        return f"at most {groups} federation groups of this size fit (F={groups})"
    return f"a federation group alone needs {k} nodes"


def _pack(topo: Topology, usable: list[str], k: int, n_units: int) -> list[list[str]] | None:
    """Choose n_units groups of k usable nodes each: best level profile, then lowest subtree. Memoized on the
    topology: a plan ranks dozens of layouts that share a few (k, n_units) on the same usable nodes."""
    key = ("pack", tuple(usable), k, n_units)
    if key not in topo.memo:
        topo.memo[key] = _search(topo, *_tree_order(topo, key[1]), k, n_units)
    return topo.memo[key]


def _tree_order(topo: Topology, usable: tuple[str, ...]) -> tuple[dict, dict]:
    """(switch -> child switches, switch -> usable nodes below it in tree order), built once per usable set."""
    key = ("order", usable)
    if key not in topo.memo:
        children: dict[str, list[str]] = {}
        for child, up in topo.parent.items():
            if child in topo.level:
                children.setdefault(up, []).append(child)
        free = set(usable)
        order = {leaf: [n for n in nodes if n in free] for leaf, nodes in topo.leaves.items()}
        for switch in sorted(topo.level, key=lambda s: topo.level[s]):  # children before their parents
            if switch not in order:
                order[switch] = [n for c in children.get(switch, []) for n in order[c]]
        topo.memo[key] = children, order
    return topo.memo[key]


def _search(topo: Topology, children: dict, order: dict, k: int, n_units: int) -> list[list[str]] | None:
    """Every switch's subtree that holds enough usable nodes, packed greedily; the best by level profile."""
    best = None
    for region in sorted(topo.level, key=lambda s: topo.level[s]):
        if len(order[region]) < k * n_units:
            continue
        groups = _greedy(topo, region, children, order, k, n_units)
        if groups is None:
            continue
        profile = sorted(level for level, _ in groups)
        score = (profile, topo.level[region], len(order[region]))
        if best is None or score < best[0]:
            best = (score, [nodes for _, nodes in groups])
    return None if best is None else best[1]


def _greedy(topo, region, children, order, k, n_units):
    """Bottom-up: fill groups under the lowest switches of `region` first; nodes are taken in tree order."""
    by_level: dict[int, list[str]] = {}
    stack = [region]
    while stack:
        s = stack.pop()
        by_level.setdefault(topo.level[s], []).append(s)
        stack += children.get(s, [])
    taken: set[str] = set()
    groups = []
    for level in sorted(by_level):
        for switch in sorted(by_level[level]):
            free = [n for n in order[switch] if n not in taken]
            while len(groups) < n_units and len(free) >= k:
                unit, free = free[:k], free[k:]
                taken.update(unit)
                groups.append((level if k > 1 else -1, unit))
        if len(groups) == n_units:
            return groups
    return None
