"""Parse + place on synthetic 3-level clusters (leaves of 32 nodes, cells of 16 leaves, one spine).

Generates `scontrol show topology` and `scontrol -o show node` text, then times parsing, building the
tree and placing an FL+HSDP job over 90 % of the nodes (targets: 10,000 nodes <= 1 s, 100,000 <= 10 s).
Prints a table of sizes vs time, whose time-per-node column shows whether growth is near-linear.
Run: python -m bench.placement [--sizes 1000,10000,100000]
"""
from __future__ import annotations

import argparse
import time

from launcher.placement import allocate, topology
from launcher.slurm.hostlist import compress

LEAF, CELL, G = 32, 16, 4
TARGETS = {10_000: 1.0, 100_000: 10.0}


def texts(n: int) -> tuple[str, str]:
    names = [f"n{i:06d}" for i in range(n)]
    leaves = [names[i:i + LEAF] for i in range(0, n, LEAF)]
    lines = [f"SwitchName=leaf{j} Level=0 LinkSpeed=1 Nodes={compress(leaf)}" for j, leaf in enumerate(leaves)]
    cells = [list(range(j, min(j + CELL, len(leaves)))) for j in range(0, len(leaves), CELL)]
    for c, members in enumerate(cells):
        nodes = [x for j in members for x in leaves[j]]
        lines.append(f"SwitchName=cell{c} Level=1 LinkSpeed=1 Nodes={compress(nodes)} "
                     f"Switches={','.join(f'leaf{j}' for j in members)}")
    lines.append(f"SwitchName=spine Level=2 LinkSpeed=1 Nodes={compress(names)} "
                 f"Switches={','.join(f'cell{c}' for c in range(len(cells)))}")
    states = ["IDLE", "IDLE", "IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN", "DOWN"]
    nodes = [f"NodeName={name} CPUTot=32 Gres=gpu:{G} State={states[i % len(states)] if i % 10 == 0 else 'IDLE'} "
             f"Partitions=gpu RealMemory=494000" for i, name in enumerate(names)]
    return "\n".join(lines) + "\n", "\n".join(nodes) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    args = ap.parse_args()
    print(f"{'nodes':>8} {'parse+build s':>14} {'place s':>9} {'total s':>9} {'us/node':>8}  target")
    for n in map(int, args.sizes.split(",")):
        topo_text, nodes_text = texts(n)
        t0 = time.perf_counter()
        topo = topology.build(topo_text, nodes_text).with_bandwidth([240e9, 25e9, 12.5e9, 6e9], "bw")
        t1 = time.perf_counter()
        usable = len(topo.usable())
        groups = (usable * 9 // 10) // 4  # FL+HSDP groups of 4 nodes (R=4, S=G)
        placement = allocate.place(groups, 4, G, G, topo)
        t2 = time.perf_counter()
        target = TARGETS.get(n)
        verdict = f"<= {target:g} s: {'met' if t2 - t0 <= target else 'MISSED'} ({(t2 - t0) / target:.2f} of it)" \
            if target else ""
        print(f"{n:>8} {t1 - t0:>14.3f} {t2 - t1:>9.3f} {t2 - t0:>9.3f} {(t2 - t0) / n * 1e6:>8.1f}  {verdict}"
              f"  [F={groups}, ok={placement.hierarchy_ok}]")


if __name__ == "__main__":
    main()
