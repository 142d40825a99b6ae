"""Wall time of `python -m launcher sweep=paper_table3 cluster=leonardo action=plan` (target < 5 s), of
the planning itself (placement, both cost models, the ranking) on a 3,456-node snapshot like Leonardo's
Booster (target <= 1 s), and of the whole command on generated snapshots of 1,000 to 100,000 nodes (target at
100,000: <= 3 s, with the time per node flat across sizes).

Runs the real command several times (a fresh interpreter each time, as a user would), then plans in-process
on a generated snapshot, and prints each median next to its target. The snapshots' node records are captured
SLURM 22.05 and 25.11 ones, every field, a fifth of the nodes allocated, mixed, drained or down (bench.snapshot).
Run: python -m bench.plan_speed [--repeats 5] [--snapshot-sizes 1000,10000,100000] [--versions 22.05,25.11]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.snapshot import write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--snapshot-sizes", default="1000,10000,100000")
    ap.add_argument("--versions", default="22.05,25.11")
    args = ap.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as results:
        for _ in range(args.repeats):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", "cluster=leonardo", "action=plan",
                            f"results_dir={results}"], check=True, capture_output=True)
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    print(f"action=plan paper_table3 on leonardo: median {median:.2f} s over {args.repeats} "
          f"(min {min(times):.2f}, max {max(times):.2f}); target < 5 s; ratio to target {median / 5:.2f}")
    snapshot_plan(args.repeats)
    for version in args.versions.split(","):
        for nodes in map(int, args.snapshot_sizes.split(",")):
            snapshot_command(nodes, version, max(1, args.repeats // 2))


def snapshot_command(nodes: int, version: str, repeats: int) -> None:
    """`action=plan` end to end (a fresh interpreter, parsing the snapshot, placing, pricing, writing) on a
    generated `nodes`-node snapshot of SLURM `version`'s node records."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = write(Path(tmp), nodes, version)
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", "cluster=leonardo",
                            f"cluster.snapshot={snapshot}", "action=plan", f"results_dir={tmp}/results"],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    target = "; target <= 3 s; ratio to target {:.2f}".format(median / 3) if nodes == 100_000 else ""
    print(f"action=plan paper_table3 on a {nodes:,}-node SLURM {version} snapshot: median {median:.2f} s over "
          f"{repeats} ({median / nodes * 1e6:.1f} us per node){target}")


def snapshot_plan(repeats: int, nodes: int = 3456) -> None:
    """plan() in-process (settings composed once) on a generated `nodes`-node snapshot, step-time model on."""
    from launcher.actions.plan import plan
    from launcher.settings import compose

    with tempfile.TemporaryDirectory() as tmp:
        snapshot = write(Path(tmp), nodes)
        settings = compose(["sweep=paper_table3", "cluster=leonardo", f"cluster.snapshot={snapshot}",
                            f"results_dir={tmp}/results"])
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            _, entries = plan(settings, echo=False)
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    print(f"planning paper_table3 ({len(entries)} runs, step-time model) on a {nodes:,}-node snapshot: median "
          f"{median:.3f} s over {repeats} (min {min(times):.3f}); target <= 1 s; ratio to target {median:.2f}")


if __name__ == "__main__":
    main()
