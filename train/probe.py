"""Collective timings per topology level, on the backend training uses (gloo on CPU, NCCL on GPU).

Every rank calls `measure` with the same levels: for each level, the rank groups that communicate across
it (one communicator per group, all groups of a level timed at once, as in training, so shared links are
contended as they would be). Each point is the slowest rank's median over `iters` calls after a warm-up.
Sizes are the whole buffer of the collective (all_gather's output, reduce_scatter's input), as nccl-tests
counts them; launcher.placement.alphabeta turns the points into alpha, bandwidth and bus bandwidth.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from launcher.placement.alphabeta import COLLECTIVES


def _run(collective: str, buf: torch.Tensor, group, n: int) -> None:
    if collective == "all_reduce":
        dist.all_reduce(buf, group=group)
    elif collective == "broadcast":
        dist.broadcast(buf, group_src=0, group=group)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(buf, buf[: buf.numel() // n].clone(), group=group)
    else:
        dist.reduce_scatter_tensor(buf[: buf.numel() // n].clone(), buf, group=group)


def _elements(size: int, n: int) -> int:
    """fp32 elements of a buffer of about `size` bytes that splits evenly over n ranks."""
    return max(n, size // 4 // n * n)


def _median_seconds(collective: str, size: int, group, n: int, device: str, iters: int) -> float:
    buf = torch.ones(_elements(size, n), dtype=torch.float32, device=device)
    times = []
    for i in range(iters + 1):  # the first call warms up the communicator and is not counted
        dist.barrier(group=group)
        start = time.perf_counter()
        _run(collective, buf, group, n)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rank: int, levels: dict[str, list[list[int]]], sizes: list[int], device: str = "cpu",
            collectives: tuple[str, ...] = COLLECTIVES, iters: int = 5, progress=None) -> list[dict]:
    """[{level, collective, ranks, points: [[bytes, seconds], ...]}] for every level and collective; every
    rank of the world must call it with the same arguments. `progress(text)` is called on rank 0."""
    out = []
    for level, groups in levels.items():
        handles = [dist.new_group(g) for g in groups]  # collective: every rank creates every group, in order
        mine = next(((g, h) for g, h in zip(groups, handles) if rank in g), None)
        n = len(groups[0])
        for collective in collectives:
            points = []
            for size in sizes:
                seconds = _median_seconds(collective, size, mine[1], n, device, iters) if mine else 0.0
                slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                points.append([_elements(size, n) * 4, slowest.item()])
            out.append({"level": level, "collective": collective, "ranks": n, "points": points})
            if progress is not None and rank == 0:
                progress(f"probe: {level} {collective} on {n} ranks, {len(sizes)} sizes done")
    return out


class ProbeJob:
    """The probe as a picklable job (submitit runs one task per rank, like a training run). The levels are
    computed where the ranks really are: under SLURM from every rank's SLURMD_NODENAME, else from the
    planned hosts (cluster=local's virtual nodes)."""

    def __init__(self, hosts: list[str], topology: dict, sizes: list[int], out_path: str, device: str,
                 backend: str, timeout_s: float, iters: int):
        self.hosts, self.topology, self.sizes, self.out_path = hosts, topology, sizes, out_path
        self.device, self.backend, self.timeout_s, self.iters = device, backend, timeout_s, iters

    def __call__(self) -> None:
        import json
        import os
        from pathlib import Path

        from launcher.placement.levels import level_groups

        from . import launch_env
        from .spec import write_atomic

        env = launch_env.detect()
        device = launch_env.pick_device(self.device)
        if device == "cpu":
            launch_env.limit_cpu_threads(env)
        out_dir = Path(self.out_path).parent
        backend = launch_env.init(env, device, self.backend, out_dir, self.timeout_s)
        hosts = [None] * env.world_size
        dist.all_gather_object(hosts, os.environ.get("SLURMD_NODENAME", self.hosts[env.rank]))
        levels = level_groups(hosts, self.topology["parent"], self.topology["level"])
        rows = measure(env.rank, levels, self.sizes, device, iters=self.iters,
                       progress=lambda text: print(text, flush=True))
        launch_env.shutdown(env, out_dir)
        if env.rank == 0:
            write_atomic(Path(self.out_path), json.dumps({"backend": backend, "hosts": hosts, "levels": rows}) + "\n")
