"""Wall time of `python -m launcher sweep=paper_table3 cluster=leonardo action=plan` (target < 5 s), of
the planning itself (placement, both cost models, the ranking) on a 3,456-node snapshot like Leonardo's
Booster (target <= 1 s), and of the whole command on generated snapshots of 1,000 to 100,000 nodes (target at
100,000: <= 3 s, with the time per node flat across sizes).

Runs the real command several times (a fresh interpreter each time, as a user would), then plans in-process
on a generated snapshot (bench.placement's synthetic tree), and prints each median next to its target.
Run: python -m bench.plan_speed [--repeats 5] [--snapshot-sizes 1000,10000,100000]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--snapshot-sizes", default="1000,10000,100000")
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
    for nodes in map(int, args.snapshot_sizes.split(",")):
        snapshot_command(nodes, max(1, args.repeats // 2))


def _snapshot(directory: Path, nodes: int) -> Path:
    """bench.placement's synthetic tree of `nodes` nodes as a captured snapshot (cluster.snapshot)."""
    from bench.placement import texts

    snapshot = directory / "snapshot"
    snapshot.mkdir()
    topology_text, nodes_text = texts(nodes)
    (snapshot / "topology.txt").write_text(topology_text)
    (snapshot / "nodes.txt").write_text(nodes_text.replace("Partitions=gpu", "Partitions=boost_usr_prod"))
    return snapshot


def snapshot_command(nodes: int, repeats: int) -> None:
    """`action=plan` end to end (a fresh interpreter, parsing the snapshot, placing, pricing, writing) on a
    generated `nodes`-node snapshot."""
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = _snapshot(Path(tmp), nodes)
        for _ in range(repeats):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", "cluster=leonardo",
                            f"cluster.snapshot={snapshot}", "action=plan", f"results_dir={tmp}/results"],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    target = "; target <= 3 s; ratio to target {:.2f}".format(median / 3) if nodes == 100_000 else ""
    print(f"action=plan paper_table3 on a {nodes:,}-node snapshot: median {median:.2f} s over {repeats} "
          f"({median / nodes * 1e6:.1f} us per node){target}")


def snapshot_plan(repeats: int, nodes: int = 3456) -> None:
    """plan() in-process (settings composed once) on a generated `nodes`-node snapshot, step-time model on."""
    from launcher.plan import plan
    from launcher.settings import compose

    with tempfile.TemporaryDirectory() as tmp:
        snapshot = _snapshot(Path(tmp), nodes)
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
