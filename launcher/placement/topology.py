"""The cluster as a tree: nodes under leaf switches (or blocks) under higher switches, with per-level bandwidth.

Levels: -1 is inside one node; 0 a leaf switch (or block); 1, 2, ... the switches above.
`bandwidth[level + 1]` is the slowest link a group whose lowest common ancestor sits at
`level` crosses, in bytes/s; it comes from the cluster config, since SLURM does not know it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from launcher.placement import gc_paused
from launcher.slurm import scontrol
from launcher.slurm.hostlist import ParseError
from launcher.slurm.parse import Block, Node, Switch, parse_nodes, parse_topology
from train.contract.common import ConfigError, SlurmError

ROOT = "(all)"  # a virtual root above several top-level switches or blocks


@dataclass
class Topology:
    parent: dict[str, str]                    # node or switch -> its switch
    level: dict[str, int]                     # switch -> level
    leaves: dict[str, list[str]]              # leaf switch -> its nodes, in hostlist order
    nodes: dict[str, Node | None] = field(default_factory=dict)  # node -> scontrol record, when known
    bandwidth: list[float] = field(default_factory=list)
    block_size: int | None = None             # topology/block: nodes of the smallest block (None: a tree)
    memo: dict = field(default_factory=dict, repr=False, compare=False)  # allocate's packings of this tree

    @property
    def top_level(self) -> int:
        return max(self.level.values())

    def ancestors(self, name: str) -> list[str]:
        """Switches above a node (or switch), lowest first."""
        out = []
        while name in self.parent:
            name = self.parent[name]
            out.append(name)
        return out

    def lca_level(self, hosts) -> int:
        """Level of the lowest switch above all `hosts` (-1 when they are one node)."""
        hosts = set(hosts)
        if len(hosts) == 1:
            return -1
        chains = [self.ancestors(h) for h in hosts]
        for depth in range(min(len(c) for c in chains)):
            if len({c[depth] for c in chains}) == 1:
                return self.level[chains[0][depth]]
        raise ConfigError(f"nodes {sorted(hosts)[:4]} share no switch")

    def level_names(self) -> list[str]:
        """What each bandwidth value describes: inside a node, then under one switch of each level (with an
        example switch), so a user can match cluster.bandwidth_GBps to this tree."""
        example = {}
        for switch, level in sorted(self.level.items()):
            example.setdefault(level, switch)
        return ["inside a node"] + [f"under one level-{lv} switch (e.g. {example[lv]})" for lv in sorted(example)]

    def link(self, level: int) -> float:
        return self.bandwidth[level + 1]

    def usable(self, now: bool = True) -> list[str]:
        """Nodes placement may use, in tree order: free now (`now`), or merely not drained/down (a job
        submitted to them waits for running work); nodes scontrol did not describe (flat, ideal) count."""
        out = []
        for leaf in self.leaves:
            out += [n for n in self.leaves[leaf] if self.nodes.get(n) is None
                    or (self.nodes[n].usable if now else self.nodes[n].schedulable)]
        return out

    def free(self, gpus: int, cpus: int) -> tuple[list[str], dict[str, list[str]]]:
        """Nodes (in tree order) whose free GPUs and CPUs hold one node's share of a job now, and the others
        by reason; nodes scontrol did not describe (flat, ideal) count as free."""
        out, excluded = [], {}
        for leaf in self.leaves:
            for n in self.leaves[leaf]:
                why = None if self.nodes.get(n) is None else self.nodes[n].not_free(gpus, cpus)
                if why is None:
                    out.append(n)
                else:
                    excluded.setdefault(why, []).append(n)
        return out, excluded

    def with_bandwidth(self, bandwidth: list[float], key: str) -> "Topology":
        """Attach per-level bandwidth; it must cover every level and never grow with level."""
        needed = self.top_level + 2
        if not bandwidth or len(bandwidth) < needed:
            raise ConfigError(f"{key} needs {needed} values (inside a node, then levels 0..{self.top_level}), "
                              f"got {len(bandwidth or [])}: give one GB/s per level, fastest first: "
                              f"[{', '.join(self.level_names())}]")
        if any(b <= 0 for b in bandwidth) or any(a < b for a, b in zip(bandwidth, bandwidth[1:])):
            raise ConfigError(f"{key} must be positive and not increase with level, got {bandwidth}")
        self.bandwidth = [float(b) for b in bandwidth[:needed]]
        return self


def from_switches(switches: list[Switch], nodes: list[Node] | None = None) -> Topology:
    """Build and validate the switch tree: one leaf per node, known children, no cycles, levels increasing."""
    by_name = {s.name: s for s in switches}
    if len(by_name) != len(switches):
        raise ConfigError("topology lists a switch twice")
    parent: dict[str, str] = {}
    leaves: dict[str, list[str]] = {}
    for s in switches:
        for child in s.switches:
            if child not in by_name:
                raise ConfigError(f"switch {s.name} names unknown child switch {child}")
            if child in parent:
                raise ConfigError(f"switch {child} is under both {parent[child]} and {s.name}")
            parent[child] = s.name
        if not s.switches:
            leaves[s.name] = list(s.nodes)
            for node in s.nodes:
                if node in parent:
                    raise ConfigError(f"node {node} is under two leaf switches: {parent[node]} and {s.name}")
                parent[node] = s.name
    level = {s.name: s.level for s in switches}
    for child, up in parent.items():
        if child in by_name and level[up] <= level[child]:
            raise ConfigError(f"switch {up} (level {level[up]}) sits above {child} (level {level[child]}): "
                              f"levels must increase upwards (or the switches form a cycle)")
    return _rooted(parent, level, leaves, nodes)


def from_blocks(blocks: list[Block], nodes: list[Node] | None = None) -> Topology:
    """Blocks are leaves (level 0); aggregated blocks are switches above them, one level per aggregation size
    (an NVL72 cluster with block_sizes 18, 36, 72: racks, pairs of racks, groups of four), each under the
    smallest larger one that covers it."""
    base = [b for b in blocks if not b.aggregated]
    parent: dict[str, str] = {}
    leaves = {}
    for b in base:
        leaves[b.name] = list(b.nodes)
        for node in b.nodes:
            if node in parent:
                raise ConfigError(f"node {node} is in two blocks: {parent[node]} and {b.name}")
            parent[node] = b.name
    level = {b.name: 0 for b in base}
    aggregated = sorted((b for b in blocks if b.aggregated), key=lambda b: len(b.nodes))
    sizes = sorted({len(b.nodes) for b in aggregated})
    for agg in aggregated:
        level[agg.name] = 1 + sizes.index(len(agg.nodes))
    for child in base + aggregated:
        above = next((a for a in aggregated if len(a.nodes) > len(child.nodes) and set(child.nodes) <= set(a.nodes)),
                     None)
        if above is not None:
            parent[child.name] = above.name
    topo = _rooted(parent, level, leaves, nodes)
    topo.block_size = min(len(b.nodes) for b in base)
    return topo


def flat(node_names: list[str]) -> Topology:
    """One switch over every node: the local executor's virtual nodes."""
    return _rooted({n: "switch" for n in node_names}, {"switch": 0}, {"switch": list(node_names)}, None)


def _rooted(parent, level, leaves, nodes) -> Topology:
    tops = [s for s in level if s not in parent]
    if len(tops) > 1:
        level[ROOT] = max(level.values()) + 1
        for s in tops:
            parent[s] = ROOT
    topo = Topology(parent=parent, level=level, leaves=leaves,
                    nodes={n.name: n for n in nodes or []})
    for leaf in leaves:
        seen = set()
        name = leaf
        while name in parent:  # a cycle never reaches a root
            if name in seen:
                raise ConfigError(f"switch cycle through {name}")
            seen.add(name)
            name = parent[name]
    return topo


@gc_paused()
def build(topology_text: str, nodes_text: str | None, snapshot: tuple[str, str] | None = None) -> Topology:
    """Parse `scontrol show topology` (tree or block) and `scontrol show node` output into a Topology. `snapshot`:
    (its directory, the topology file's name) when the texts are a snapshot's files, which must then be whole
    (scontrol.check_snapshot) and whose parse errors name the file."""
    items = _parsed(parse_topology, topology_text, snapshot and (snapshot[0], snapshot[1]))
    nodes = _parsed(parse_nodes, nodes_text, snapshot and (snapshot[0], "nodes.txt")) if nodes_text else None
    if not items:  # no TopologyPlugin: every node under one switch
        if not nodes:
            raise ConfigError("scontrol printed neither a topology nor any node")
        topo = flat([n.name for n in nodes])
        topo.nodes = {n.name: n for n in nodes}
        return topo
    topo = from_blocks(items, nodes) if isinstance(items[0], Block) else from_switches(items, nodes)
    if nodes is not None and not any(n.name in topo.parent for n in nodes):
        raise ConfigError("no node of `scontrol show node` appears in the topology")
    if snapshot is not None:
        scontrol.check_snapshot(snapshot[0], snapshot[1], items, nodes or [])
    return topo


def _parsed(parse, text: str, file: tuple[str, str] | None):
    """parse(text); a snapshot file's parse error names the file."""
    try:
        return parse(text)
    except ParseError as e:
        if file is None:
            raise
        raise ParseError(f"snapshot file {scontrol.snapshot_path(*file)}: {e}") from None


def ideal(n_nodes: int, nodes_per_level: list[int]) -> Topology:
    """A full tree of `n_nodes` virtual nodes: nodes_per_level[i] nodes under one level-(i-1) switch."""
    if not nodes_per_level or nodes_per_level[0] != 1 or any(
            b % a for a, b in zip(nodes_per_level, nodes_per_level[1:])):
        raise ConfigError(f"cluster.nodes_per_level must start at 1 and each entry divide the next, "
                          f"got {nodes_per_level}")
    names = [f"node{i + 1:0{len(str(n_nodes))}d}" for i in range(n_nodes)]
    parent, level, leaves = {}, {}, {}
    for lvl, size in enumerate(nodes_per_level[1:]):
        for start in range(0, n_nodes, size):
            switch = f"L{lvl}s{start // size}"
            level[switch] = lvl
            below = names[start:start + size]
            if lvl == 0:
                leaves[switch] = below
                parent.update({n: switch for n in below})
            else:
                step = nodes_per_level[lvl]
                parent.update({f"L{lvl - 1}s{c // step}": switch for c in range(start, start + len(below), step)})
    return _rooted(parent, level, leaves, None)


def virtual(cluster) -> tuple[Topology, str, bool]:
    """An ideal tree of the cluster's virtual nodes (every rank on this machine), with bandwidth attached."""
    topo = ideal(cluster.nodes, cluster.nodes_per_level)
    return topo.with_bandwidth(cluster.bandwidth, "cluster.bandwidth_GBps"), "virtual nodes", False


def load(cluster) -> tuple[Topology, str, bool]:
    """A SLURM cluster's topology with bandwidth attached, where it came from, and whether it is the real one: the
    snapshot directory when set; else live scontrol when it speaks for this cluster (`live_source`); else an ideal
    tree from cluster.nodes_per_level, saying why."""
    if cluster.snapshot:
        source, live = f"snapshot {cluster.snapshot}", True
    else:
        live, source = live_source(cluster)
    if live:
        name = scontrol.topology_name(cluster)
        snapshot = (cluster.snapshot, scontrol.topology_file(name)) if cluster.snapshot else None
        topo = build(scontrol.topology_text(cluster.snapshot, name), scontrol.nodes_text(cluster.snapshot), snapshot)
        source += f", topology {name}" if name else ""
    else:
        topo = ideal(cluster.nodes, cluster.nodes_per_level)
    return topo.with_bandwidth(cluster.bandwidth, "cluster.bandwidth_GBps"), source, live


def live_source(cluster) -> tuple[bool, str]:
    """Whether this machine's scontrol describes `cluster`, and the plan's words for the source.

    Planning Leonardo from another cluster's login node must not place its runs on that cluster's nodes,
    nor fail on a machine with SLURM's client and no controller: with cluster.topology=auto scontrol is
    read only when its ClusterName is cluster.slurm_name (default: cluster.name); `live` always reads
    it (failures are errors), `ideal` never does.
    """
    ideal_tree = "ideal tree (cluster.nodes_per_level)"
    if cluster.topology == "live":
        return True, "live scontrol (cluster.topology=live)"
    if cluster.topology == "ideal":
        return False, f"{ideal_tree}: cluster.topology=ideal"
    if not _has_scontrol():
        return False, f"{ideal_tree}: no scontrol on PATH"
    try:
        name = scontrol.cluster_name()
    except SlurmError as e:
        reason = str(e).strip().splitlines()[-1].rsplit(": ", 1)[-1][:80]  # scontrol's own last words, not its trace
        return False, f"{ideal_tree}: no SLURM controller answered ({reason})"
    expected = cluster.slurm_name or cluster.name
    if name != expected:
        return False, (f"{ideal_tree}: this machine's SLURM is cluster {name!r}, not {expected!r} "
                       f"(cluster.topology=live reads it anyway)")
    return True, f"live scontrol of cluster {name!r}"


def _has_scontrol() -> bool:
    import shutil

    return shutil.which("scontrol") is not None


def to_json(topo: Topology) -> dict:
    """What a job or a report needs to re-derive placements: the tree and its bandwidth (node states are not kept)."""
    return {"parent": topo.parent, "level": topo.level, "leaves": topo.leaves, "bandwidth": topo.bandwidth,
            "block_size": topo.block_size}


def from_json(raw: dict) -> Topology:
    return Topology(parent=raw["parent"], level=raw["level"], leaves=raw["leaves"], bandwidth=raw["bandwidth"],
                    block_size=raw.get("block_size"))
