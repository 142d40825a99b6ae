"""Parse + place on generated 3-level clusters whose node records are captured SLURM 22.05 and 25.11 ones
(bench.snapshot: every field, a fifth of the nodes allocated, mixed, drained or down).

Times parsing `scontrol show topology` and `scontrol -o show node`, building the tree and placing an FL+HSDP job
over 90 % of the usable nodes (targets: 10,000 nodes <= 1 s, 100,000 <= 10 s). Prints a table of sizes vs time
per SLURM version, whose time-per-node column shows whether growth is near-linear.
Run: python -m bench.placement [--sizes 1000,10000,100000] [--versions 22.05,25.11]
"""
from __future__ import annotations

import argparse
import time

from bench import snapshot
from launcher.placement import allocate, topology

G = 4  # GPUs a node (the captured records' Gres=gpu:4)
TARGETS = {10_000: 1.0, 100_000: 10.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--versions", default=",".join(snapshot.CAPTURES))
    args = ap.parse_args()
    print(f"{'slurm':>6} {'nodes':>8} {'parse+build s':>14} {'place s':>9} {'total s':>9} {'us/node':>8}  target")
    for version, n in ((v, n) for v in args.versions.split(",") for n in map(int, args.sizes.split(","))):
        topo_text, nodes_text = snapshot.topology_text(n), snapshot.nodes_text(n, version)
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
        print(f"{version:>6} {n:>8} {t1 - t0:>14.3f} {t2 - t1:>9.3f} {t2 - t0:>9.3f} {(t2 - t0) / n * 1e6:>8.1f}  "
              f"{verdict}  [F={groups}, ok={placement.hierarchy_ok}]")


if __name__ == "__main__":
    main()
