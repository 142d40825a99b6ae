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
    """Median seconds of this rank's group (0.0 on a rank in no group of the level). Every rank of the world
    enters each call through one barrier, so all groups of a level run at once and share links as data-parallel
    groups do in a step, instead of drifting apart and each finding the links idle."""
    buf = torch.ones(_elements(size, n), dtype=torch.float32, device=device) if group else None
    times = []
    for i in range(iters + 1):  # the first call warms up the communicator and is not counted
        dist.barrier()
        if group is None:
            continue
        start = time.perf_counter()
        _run(collective, buf, group, n)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times) if times else 0.0


def measure(rank: int, levels: dict[str, list[list[int]]], sizes: list[int], collectives: tuple[str, ...],
            device: str = "cpu", iters: int = 5, progress=None) -> list[dict]:
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
                seconds = _median_seconds(collective, size, mine[1] if mine else None, n, device, iters)
                slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                points.append([_elements(size, n) * 4, slowest.item()])
            out.append({"level": level, "collective": collective, "ranks": n, "points": points})
            if progress is not None and rank == 0:
                progress(f"probe: {level} {collective} on {n} ranks, {len(sizes)} sizes done")
    return out



def barrier_seconds(device: str = "cpu", iters: int = 20) -> float:
    """The slowest rank's median seconds of a barrier over the whole world, after a warm-up: what each of a run's
    phase boundaries (train.timing=phases) and each non-finite check before a FedAvg costs it."""
    times = []
    for i in range(iters + 1):
        start = time.perf_counter()
        dist.barrier()
        if i:
            times.append(time.perf_counter() - start)
    slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()
