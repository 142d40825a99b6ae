"""gloo all_reduce bus bandwidth at each level of the testbed: inside a node, under a leaf, across the spine.

Run inside the testbed: slurm/testbed/lab python -m bench.testbed_links
Each level is one `srun` of 2 tasks on a chosen node pair; busbw = 2(n-1)/n * bytes / time, the
median of several all_reduces. Prints the three rates and their ratios next to the values
conf/cluster/testbed.yaml gives the planner (bandwidth_GBps).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

LEVELS = {"inside a node": ("tb2", 1), "under a leaf": ("tb2,tb4", 2), "across the spine": ("tb1,tb2", 2)}


def worker(size_mb: int, repeats: int, run_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from train.runtime import launch_env

    env = launch_env.detect()
    launch_env.init(env, "cpu", "gloo", Path(run_dir), 120)
    buf = torch.ones(size_mb * 2**20 // 4)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t)
    n = env.world_size
    busbw = 2 * (n - 1) / n * buf.numel() * 4 / statistics.median(times[1:])
    if env.rank == 0:
        print(f"BUSBW {busbw}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", metavar="RUN_DIR")
    args = ap.parse_args()
    if args.worker:
        return worker(args.size_mb, args.repeats, args.worker)
    conf = yaml.safe_load(open(os.path.join(os.path.dirname(__file__), "..", "conf", "cluster", "testbed.yaml")))
    rates = {}
    for level, (nodes, n_nodes) in LEVELS.items():
        with tempfile.TemporaryDirectory(dir=os.getcwd()) as run_dir:
            out = subprocess.run(["srun", "-w", nodes, "-N", str(n_nodes), "-n", "2",
                                  "--export=ALL,GLOO_SOCKET_IFNAME=eth0,OMP_NUM_THREADS=1",
                                  sys.executable, "-m", "bench.testbed_links", "--worker", run_dir,
                                  "--size-mb", str(args.size_mb), "--repeats", str(args.repeats)],
                                 capture_output=True, text=True, timeout=600)
        line = [text for text in out.stdout.splitlines() if text.startswith("BUSBW")]
        if not line:
            raise SystemExit(f"{level}: no measurement ({out.stderr.strip()[-300:]})")
        rates[level] = float(line[0].split()[1])
    print(f"gloo all_reduce busbw, {args.size_mb} MiB, 2 ranks, median of {args.repeats}:")
    configured = conf["bandwidth_GBps"]
    for (level, rate), planned in zip(rates.items(), configured):
        print(f"  {level:<17} {rate / 1e6:9.1f} MB/s   (planner assumes {planned * 1e3:.0f} MB/s)")
    values = list(rates.values())
    print(f"  ratios node : leaf : spine = {values[0] / values[2]:.0f} : {values[1] / values[2]:.1f} : 1")


if __name__ == "__main__":
    main()
