"""Collective timings per topology level, on the backend training uses (gloo on CPU, NCCL on GPU).

Every rank calls `measure` with the same levels: for each level, the rank groups that communicate across
it (one communicator per group, all groups of a level timed at once, as in training, so shared links are
contended as they would be). Each point is the slowest rank's median over its calls after a warm-up, at least
`iters` calls and as many as last MIN_POINT_S (at most MAX_POINT_ITERS). Sizes are the whole buffer of the
collective (all_gather's output, reduce_scatter's input), as nccl-tests counts them;
launcher.placement.alphabeta turns the points into alpha, bandwidth and bus bandwidth. Beside each point its
distribution is kept (`dist`): every member rank's seconds per call, pooled, as quantiles, and the slowest member
of each group per call, since a synchronising collective waits for its slowest rank (issue 54, item 2: the jitter of
n ranks is the expected maximum of n draws, launcher.placement.alphabeta.expected_max). `measure_groups` times
given communicators the same way: the sweep's runs' own groups at their own sizes.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from train.measure import robust

MIN_POINT_S = 0.1  # a point's calls last at least this long: small messages get enough calls for a distribution
MAX_POINT_ITERS = 50


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


def _seconds(collective: str, size: int, group, n: int, device: str, iters: int) -> tuple[float, list[float]]:
    """This rank's seconds of the warm-up call and of each timed call (0.0 on a rank in no group of the level), as
    many calls on every rank: at least `iters`, and as many as last MIN_POINT_S by the slowest rank's warm-up call.
    Every rank of the world enters each call through one barrier, so all groups of a level run at once and share
    links as data-parallel groups do in a step, instead of drifting apart and each finding the links idle."""
    buf = torch.ones(_elements(size, n), dtype=torch.float32, device=device) if group else None

    def once() -> float:
        dist.barrier()
        if group is None:
            return 0.0
        start = time.perf_counter()
        _run(collective, buf, group, n)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    warm = once()  # the first call warms up the communicator and is not counted
    count = torch.tensor([min(MAX_POINT_ITERS, max(iters, math.ceil(MIN_POINT_S / max(warm, 1e-9))))], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return warm, [once() for _ in range(int(count.item()))]


def _point(collective: str, size: int, groups: list[list[int]], mine, device: str, iters: int) -> tuple[list, dict]:
    """([bytes, the slowest member's median seconds], the point's distribution): every rank's calls gathered, so
    every rank returns the same numbers. The distribution: `median_s` and `quantiles_s` (robust.QUANTILES, 0 to
    100 %) of every member rank's seconds per call, pooled; `slowest_median_s` and `slowest_interval_s` (95 %) of
    the slowest member of each group in each call; `iters`, the calls per rank; `first_call_s`, the slowest rank's
    warm-up call (on a communicator's first use it holds its set-up: NCCL creates one at its first collective)."""
    n = len(groups[0])
    warm, mine_s = _seconds(collective, size, mine, n, device, iters)
    times = torch.tensor(mine_s + [warm], dtype=torch.float64, device=device)
    everyone = torch.empty(dist.get_world_size() * times.numel(), dtype=torch.float64, device=device)
    dist.all_gather_into_tensor(everyone, times)
    per_rank = everyone.view(dist.get_world_size(), -1).tolist()
    first = max(row.pop() for row in per_rank)
    members = [r for g in groups for r in g]
    pooled = [t for r in members for t in per_rank[r]]
    slowest = [max(per_rank[r][i] for r in g) for g in groups for i in range(len(mine_s))]
    interval = robust.median_interval(slowest)
    return ([_elements(size, n) * 4, max(statistics.median(per_rank[r]) for r in members)],
            {"bytes": _elements(size, n) * 4, "iters": len(mine_s), "median_s": statistics.median(pooled),
             "quantiles_s": robust.quantiles(pooled), "slowest_median_s": statistics.median(slowest),
             "slowest_interval_s": list(interval), "first_call_s": first})


def _groups(rank: int, groups: list[list[int]], device: str) -> tuple[object, float]:
    """(this rank's communicator or None, the slowest rank's seconds creating them all): every rank creates every
    group, in order (dist.new_group is collective); gloo connects its members there, as a run does at its start.
    Each group's members keep the order given, the run's rank order: a gloo ring passes its bytes from one member
    to the next in that order, so sorted by the probe's own rank numbers a ring of 4 nodes under two leaves could
    cross the trunk at every hop where the run's crosses it twice, and cost twice the run's."""
    start = time.perf_counter()
    made = [dist.new_group(g, sort_ranks=False) for g in groups]
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return next((h for g, h in zip(groups, made) if rank in g), None), took.item()


def measure(rank: int, levels: dict[str, list[list[int]]], sizes: list[int], collectives: tuple[str, ...],
            device: str = "cpu", iters: int = 5, progress=None) -> list[dict]:
    """[{level, collective, ranks, points: [[bytes, seconds], ...], dist: [per point, _point's], setup_s (creating
    the level's communicators, once for all its collectives)}] for every level and collective; every rank of the
    world must call it with the same arguments. `progress(text)` is called on rank 0."""
    out = []
    for level, groups in levels.items():
        mine, setup_s = _groups(rank, groups, device)
        n = len(groups[0])
        for collective in collectives:
            points, spread = zip(*(_point(collective, size, groups, mine, device, iters) for size in sizes))
            out.append({"level": level, "collective": collective, "ranks": n, "points": list(points),
                        "dist": list(spread), "setup_s": setup_s})
            if progress is not None and rank == 0:
                progress(f"probe: {level} {collective} on {n} ranks, {len(sizes)} sizes done")
    return out


def measure_groups(rank: int, specs: list[dict], device: str = "cpu", iters: int = 5, progress=None) -> list[dict]:
    """The same for given communicators, each spec {collective, groups: [[rank, ...], ...] (all active at once),
    sizes: [bytes, ...], and anything else, kept}: [{**spec, ranks, points, dist, setup_s}]. The sweep's runs' own
    groups (their full size, as each run has them) at their own FSDP units' sizes, and pairs of a level's ranks
    (train.job.probe). Every rank of the world must call it with the same specs."""
    out, handles = [], {}
    for spec in specs:
        groups = [list(g) for g in spec["groups"]]
        key = tuple(map(tuple, groups))
        if key not in handles:
            handles[key] = _groups(rank, groups, device)
        mine, setup_s = handles[key]
        points, spread = zip(*(_point(spec["collective"], size, groups, mine, device, iters)
                               for size in spec["sizes"]))
        out.append({**spec, "ranks": len(groups[0]), "points": list(points), "dist": list(spread),
                    "setup_s": setup_s})
        if progress is not None and rank == 0:
            progress(f"probe: {spec['collective']} on {len(groups)} group(s) of {len(groups[0])} ranks "
                     f"({', '.join(spec.get('kinds', []))}), {len(spec['sizes'])} sizes done")
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
