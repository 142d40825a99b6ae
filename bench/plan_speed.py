"""Wall time of `python -m launcher sweep=paper_table3 cluster=leonardo action=plan` (target < 5 s).

Runs the real command several times (a fresh interpreter each time, as a user would) and prints
the median next to the target.
Run: python -m bench.plan_speed [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
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


if __name__ == "__main__":
    main()
