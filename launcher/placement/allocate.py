"""Rank placement honouring B_T >= B_P >= B_S > B_R > B_F: tensor-parallel groups inside a node, pipeline stages
next, shard groups inside a node where they fit, federation groups under the lowest switch.

The ranks of one federation group are contiguous (row-major (f, r, s, p, t), train.contract.layout), so placing a
group means choosing its nodes; rank k then runs on the (k // G)-th chosen node. Groups
are packed bottom-up: as many as possible under single leaves, then under single level-1
switches, and so on — which maximises, level by level, how many groups stay low. Among
subtrees that achieve that best profile the lowest one is used, so the federation
traffic between groups also crosses as few levels as possible.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from launcher.placement import gc_paused
from launcher.placement.topology import Topology
from train.contract.common import ConfigError
from train.contract.layout import Layout


class NoPlacement(ConfigError):
    """No set of usable nodes can hold the layout; the message says why and what would fit."""


@dataclass
class Placement:
    nodes: list[str]            # chosen nodes, in rank order
    hosts: list[str]            # host of every rank
    coords: list[tuple]         # (f, r, s, p, t) of every rank
    group_levels: list[int]     # lowest common switch level of each federation group (-1: one node)
    bandwidth: dict             # B_T, B_P, B_S, B_R, B_F bottlenecks in bytes/s (None where a group has one member)
    hierarchy_ok: bool
    loads: dict | None = field(default=None, repr=False, compare=False)  # its traffic per level (steptime.load),
    # priced once: a ranking prices each placement for several strategies and A

    def hostfile(self) -> str:
        """One host per line in rank order: SLURM_HOSTFILE for `srun --distribution=arbitrary`."""
        return "".join(h + "\n" for h in self.hosts)


def units(layout: Layout, G: int) -> tuple[int, int]:
    """(nodes per packing unit, number of units): a unit is one federation group, or one node of several groups. A
    shard's P x T model-parallel ranks are consecutive, so they pack like S x P x T shards."""
    F, S = layout.F, layout.S * layout.P * layout.T
    group = layout.R * S
    if S % G and G % S:
        raise ConfigError(f"S={S} shards neither fill whole nodes of {G} GPUs nor divide one")
    if group % G == 0:
        return group // G, F
    if G % group == 0 and (F * group) % G == 0:
        return 1, F * group // G
    raise ConfigError(f"a federation group of R*S={group} ranks neither fills whole nodes of {G} GPUs "
                      f"nor packs evenly into them")


@gc_paused()
def place(layout: Layout, G: int, topo: Topology, usable: list[str] | None = None) -> Placement:
    """Each rank's node (units); a tensor-parallel group that does not fit one node's G GPUs is refused."""
    L = layout
    check_model_parallel(L.T, G)
    k, n_units = units(L, G)
    usable = topo.usable() if usable is None else usable
    name = f"(F,R,S)=({L.F},{L.R},{L.S})" + (f" with pp={L.P}, tp={L.T}" if L.P * L.T > 1 else "")
    if len(usable) < k * n_units:
        hint = f"; to size the sweep to them, set cluster.nodes={len(usable)}" if usable else ""
        raise NoPlacement(f"{name} needs {k * n_units} nodes of {G} GPUs but only {len(usable)} "
                          f"are usable; {_what_fits(L, G, len(usable))}{hint}")
    chosen = _pack(topo, usable, k, n_units)
    if chosen is None:
        raise NoPlacement(f"{name} cannot be placed on the usable nodes")
    nodes = [n for unit in chosen for n in unit]
    return assess(L, [nodes[rank // G] for rank in range(L.world)], topo, nodes=nodes)


def shards_per_node(nodes: int, G: int, P: int, T: int) -> tuple[int, int] | None:
    """(nodes, shards per node) as the data-parallel grid sees them when each shard is a pipeline of P x T GPUs:
    G / (P x T) shards on each node, or one shard over every (P x T) / G nodes; None when neither divides."""
    mp = P * T
    if mp <= G and G % mp == 0:
        return nodes, G // mp
    if mp % G == 0 and nodes % (mp // G) == 0:
        return nodes // (mp // G), 1
    return None


def check_model_parallel(T: int, G: int) -> None:
    """A tensor-parallel group exchanges activations at every layer: it must sit inside one node."""
    if G % T:
        raise ConfigError(f"train.tp={T} does not divide the {G} GPUs of a node: a tensor-parallel group must fit "
                          f"inside one node (use a divisor of {G})")


def in_slurm_order(placement: Placement, layout: Layout, G: int, topo: Topology) -> Placement:
    """The same nodes with ranks in SLURM's own order (cluster.placement=slurm, what the paper ran): srun's block
    distribution fills nodes in node-name order, whatever the switches they hang from (on the testbed, whose
    slurm.conf lists tb2, tb4, tb1, tb3 by leaf, `srun -N4` numbers tasks tb1, tb2, tb3, tb4)."""
    nodes = sorted(placement.nodes, key=_name_key)
    return assess(layout, [nodes[rank // G] for rank in range(layout.world)], topo, nodes=nodes)


def _name_key(node: str) -> list:
    """tb2 < tb10: digit runs compare as numbers, as SLURM's hostlists do."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", node) if part]


def communicators(layout: Layout) -> dict[str, list[list[tuple]]]:
    """The (f, r, s, p, t) members of every shard, replicate, federation, pipeline and tensor-parallel group; in
    FL+HSDP every replica averages its 1/R of the shard across the groups (train.federation.federated), so the
    federation has R x S groups, all at once on the links they share."""
    return _communicators(*layout.shape)


@functools.cache
def _communicators(F: int, R: int, S: int, P: int, T: int) -> dict[str, list[list[tuple]]]:
    """Cached by grid: placing and pricing a layout both walk them, and layouts that differ in strategy or A share
    them (callers only read)."""
    mp = [(p, t) for p in range(P) for t in range(T)]
    return {"shard": [[(f, r, s, p, t) for s in range(S)] for f in range(F) for r in range(R) for p, t in mp],
            "replicate": [[(f, r, s, p, t) for r in range(R)] for f in range(F) for s in range(S) for p, t in mp],
            "federation": [[(f, r, s, p, t) for f in range(F)] for r in range(R) for s in range(S) for p, t in mp],
            "pipeline": [[(f, r, s, p, t) for p in range(P)] for f in range(F) for r in range(R) for s in range(S)
                         for t in range(T)],
            "tensor": [[(f, r, s, p, t) for t in range(T)] for f in range(F) for r in range(R) for s in range(S)
                       for p in range(P)]}


BANDWIDTH_KEYS = {"shard": "B_S", "replicate": "B_R", "federation": "B_F", "pipeline": "B_P", "tensor": "B_T"}
HIERARCHY = ("B_T", "B_P", "B_S", "B_R", "B_F")  # fastest first: the order the links must honour


@gc_paused()
def assess(layout: Layout, hosts: list[str], topo: Topology, nodes: list[str] | None = None) -> Placement:
    """Per-level bottlenecks of a given rank -> host map (a plan, or where a finished run really ran)."""
    grid = [layout.coords(rank) for rank in range(layout.world)]
    host = dict(zip(grid, hosts))

    def worst(groups) -> float | None:
        levels = [topo.lca_level({host[c] for c in group}) for group in groups if len(group) > 1]
        return topo.link(max(levels)) if levels else None

    bandwidth = {BANDWIDTH_KEYS[kind]: worst(g) for kind, g in communicators(layout).items()}
    present = [bandwidth[k] for k in HIERARCHY if bandwidth[k] is not None]
    ok = all(a >= b for a, b in zip(present, present[1:]))
    per_group = layout.group_world
    group_hosts = [{hosts[r] for r in range(f * per_group, (f + 1) * per_group)} for f in range(layout.F)]
    return Placement(nodes=nodes or list(dict.fromkeys(hosts)), hosts=hosts, coords=grid,
                     group_levels=[topo.lca_level(h) for h in group_hosts], bandwidth=bandwidth, hierarchy_ok=ok)


def _what_fits(layout: Layout, G: int, usable: int) -> str:
    k = max(1, layout.R * layout.S * layout.P * layout.T // G)
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
