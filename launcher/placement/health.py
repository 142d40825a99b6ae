"""What preflight names (train.job.preflight measures; launcher.actions.preflight and, inside a job,
launcher.placement.injob.PreflightedJob judge): a rank whose matrix multiply runs below a fraction of the ranks'
median, a node whose links to every neighbour run below that fraction of the other links at the same topology
level, or a single slow link. Torch-free arithmetic on the measurements and the topology."""
from __future__ import annotations

import statistics

from launcher.placement import topology

GB = 1e9
FILE = "preflight.json"  # in a run's directory: what its job's preflight named, for the launcher's retry


def judge(found: dict, topo: topology.Topology | None, fraction: float) -> list[str]:
    """What preflight names, one line each: slow ranks (multiply below `fraction` of the median), slow nodes (every
    link of theirs below `fraction` of the other links at its topology level), and slow links between two nodes that
    are otherwise fine. Empty: nothing is slow. The cluster's expected figures are shown beside, not judged by: a
    ping-pong's rate is not the bus bandwidth cluster.bandwidth_GBps states."""
    out = []
    flops = [f for _, _, f in found["ranks"]]
    median = statistics.median(flops)
    for rank, host, f in found["ranks"]:
        if f < fraction * median:
            out.append(f"rank {rank} on {host}: matrix multiply at {f / 1e9:.3g} GFLOP/s, {f / median:.2f} of the "
                       f"ranks' median {median / 1e9:.3g}")
    slow = _slow_pairs(found["pairs"], topo, fraction)
    by_node: dict[str, list[bool]] = {}
    for a, b, rate in found["pairs"]:
        for node in (a, b):
            by_node.setdefault(node, []).append((a, b, rate) in slow)
    culprits = sorted(node for node, flags in by_node.items() if len(flags) > 1 and all(flags))
    for node in culprits:
        rates = ", ".join(f"{(b if a == node else a)} {rate / GB:.3g} GB/s" for a, b, rate in slow if node in (a, b))
        out.append(f"node {node}: its links ran slow to every neighbour ({rates})")
    for a, b, rate in slow:
        if a not in culprits and b not in culprits:
            out.append(f"the link between {a} and {b}: {rate / GB:.3g} GB/s")
    return out


def _slow_pairs(pairs: list, topo: topology.Topology | None, fraction: float) -> list[tuple]:
    """The pairs below `fraction` of the median of the pairs at their topology level (a level with one pair has no
    peers to judge it by)."""
    level = {(a, b): topo.lca_level({a, b}) if topo is not None and a != b else -1 for a, b, _ in pairs}
    by_level: dict[int, list[float]] = {}
    for a, b, rate in pairs:
        by_level.setdefault(level[a, b], []).append(rate)
    return [(a, b, rate) for a, b, rate in pairs
            if len(by_level[level[a, b]]) > 1 and rate < fraction * statistics.median(by_level[level[a, b]])]


def excluded(named: list[str]) -> list[str]:
    """The nodes the named problems put in doubt (for --exclude)."""
    nodes = set()
    for line in named:
        words = line.split()
        if line.startswith("node "):
            nodes.add(words[1].rstrip(":"))
        elif line.startswith("rank "):
            nodes.add(words[3].rstrip(":"))
    return sorted(nodes)
