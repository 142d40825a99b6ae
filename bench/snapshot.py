"""Cluster snapshots of any size whose node records are a real SLURM's: the benchmarks' input.

A timing on tidy node lines (a few fields, every node idle) flatters the parser: `scontrol -o show node` on a
real cluster prints some 40 fields a node, an OS string and a drain reason with spaces in them, and a fifth of
the nodes allocated, mixed, drained or down. Each generated node here is a copy of one record captured from
SLURM 22.05.8 or 25.11.7 (tests/fixtures/, every field as the daemon printed it, multi-line records joined the
way `-o` joins them), renamed, in the state its place in the mix gives it: 80 % idle, 6 % mixed, 6 % allocated
(CPUs and memory in AllocTRES), 4 % drained, 4 % down. A state the capture of that version lacks is the idle
record with its State, CPUAlloc and AllocTRES (and a Reason) set as SLURM sets them. The switches are a
3-level tree: leaves of 32 nodes, cells of 16 leaves, one spine.
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np

from launcher.slurm.hostlist import compress
from launcher.slurm.parse import parse_key_values

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
CAPTURES = {
    "22.05": ["slurm-22.05.8/show_node_oneliner.txt"],
    "25.11": [f"slurm-25.11.7/tree_topology_conf/show_node_{n}.txt" for n in ("lrdn0001", "lrdn0005_idle",
                                                                             "lrdn0008_drain")],
}
MIX = {"IDLE": 0.80, "MIXED": 0.06, "ALLOCATED": 0.06, "IDLE+DRAIN": 0.04, "DOWN": 0.04}
LEAF, CELL = 32, 16
_REASON = " Reason=bench {} [root@2026-11-29T07:21:04]"


@cache
def records(version: str) -> dict[str, str]:
    """One captured one-line record per state of MIX, for `version` (see the module docstring)."""
    if version not in CAPTURES:
        raise ValueError(f"no captured node records for SLURM {version}; have {', '.join(CAPTURES)}")
    lines = []
    for name in CAPTURES[version]:  # a multi-line record joined as -o prints it (checked against 22.05's -o)
        text = (FIXTURES / name).read_text().strip("\n")
        lines += text.splitlines() if "\n   " not in text else [text.replace("\n   ", " ")]
    by_state = {}
    for line in lines:
        by_state.setdefault(parse_key_values(line)["State"], line)
    idle = by_state["IDLE"]
    for state in MIX:
        if state not in by_state:
            cpus = "32" if state == "ALLOCATED" else "0"
            alloc = "cpu=32,mem=494000M" if state == "ALLOCATED" else ""
            record = re.sub(r" State=\S+", f" State={state}", idle)
            record = re.sub(r" CPUAlloc=\d+", f" CPUAlloc={cpus}", record)
            record = re.sub(r" AllocTRES=\S*", f" AllocTRES={alloc}", record)
            by_state[state] = record + (_REASON.format(state.lower()) if state in ("DOWN", "IDLE+DRAIN") else "")
    return {state: by_state[state] for state in MIX}


def node_names(n: int) -> list[str]:
    return [f"lrdn{i:06d}" for i in range(n)]


def nodes_text(n: int, version: str = "25.11", seed: int = 0) -> str:
    """`scontrol -o show node` of `n` nodes: captured records, renamed, states drawn by MIX."""
    by_state = records(version)
    heads = {s: r.split(" ", 1) for s, r in by_state.items()}  # ("NodeName=...", the rest of the record)
    states = np.random.default_rng(seed).choice(list(MIX), size=n, p=list(MIX.values()))
    return "".join(f"NodeName={name} {heads[state][1]}\n" for name, state in zip(node_names(n), states))


def topology_text(n: int) -> str:
    """`scontrol show topology` of a 3-level tree over the nodes of nodes_text(n)."""
    names = node_names(n)
    leaves = [names[i:i + LEAF] for i in range(0, n, LEAF)]
    lines = [f"SwitchName=leaf{j} Level=0 LinkSpeed=1 Nodes={compress(leaf)}" for j, leaf in enumerate(leaves)]
    cells = [list(range(j, min(j + CELL, len(leaves)))) for j in range(0, len(leaves), CELL)]
    for c, members in enumerate(cells):
        nodes = [x for j in members for x in leaves[j]]
        lines.append(f"SwitchName=cell{c} Level=1 LinkSpeed=1 Nodes={compress(nodes)} "
                     f"Switches={','.join(f'leaf{j}' for j in members)}")
    lines.append(f"SwitchName=spine Level=2 LinkSpeed=1 Nodes={compress(names)} "
                 f"Switches={','.join(f'cell{c}' for c in range(len(cells)))}")
    return "\n".join(lines) + "\n"


def write(directory: Path, n: int, version: str = "25.11") -> Path:
    """A snapshot directory (cluster.snapshot) of `n` nodes."""
    snapshot = directory / "snapshot"
    snapshot.mkdir()
    (snapshot / "topology.txt").write_text(topology_text(n))
    (snapshot / "nodes.txt").write_text(nodes_text(n, version))
    return snapshot
