"""Preflight on the nodes a job got (action=preflight, and inside each SLURM job before it trains with
cluster.preflight=true): a matrix multiply on every rank's device, and a ping-pong between each node's first rank
and its two neighbours in node order (two rounds of disjoint pairs, every pair at once), so one slow GPU or one
slow link is named before a large allocation trains on it. Every rank returns the same measurements; the launcher
(launcher.actions.preflight) judges them.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.common import write_atomic
from train.runtime import launch_env
from train.runtime.ending import leave_when_the_task_ends

GEMM_N = {"cuda": 8192, "cpu": 512}  # a matrix side that keeps each device busy for milliseconds, not seconds
REPEATS = 3  # each rate is the best of this many timings: a slow device or link is slow every time, noise is not


def gemm_flops(device: str, iters: int) -> float:
    """This rank's matrix-multiply rate in FLOP/s (bf16 on a GPU, fp32 on one CPU core), after one warm-up."""
    n = GEMM_N[device]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.mm(a, b)
    best = 0.0
    for _ in range(REPEATS):
        launch_env.sync_device(device)
        start = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b)
        launch_env.sync_device(device)
        best = max(best, 2 * n ** 3 * iters / (time.perf_counter() - start))
    return best


def rounds(leaders: list[int]) -> list[list[tuple[int, int]]]:
    """Two rounds of disjoint pairs of node leaders (ranks), neighbours in node order, the ring closed: each node
    is measured against two others, so a slow node is the one common to its slow pairs."""
    n = len(leaders)
    if n < 2:
        return []
    first = [(leaders[i], leaders[i + 1]) for i in range(0, n - 1, 2)]
    seen = {frozenset(pair) for pair in first}
    second = [(leaders[i], leaders[(i + 1) % n]) for i in range(1, n, 2)
              if frozenset((leaders[i], leaders[(i + 1) % n])) not in seen and (i + 1) % n != i]
    return [first, second] if second else [first]


def ping_pong(rank: int, pair: tuple[int, int], nbytes: int, iters: int, device: str) -> float:
    """Bytes per second both ways between the two ranks of `pair`: the first sends, the second sends back."""
    buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
    peer = pair[1] if rank == pair[0] else pair[0]
    best = 0.0
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(iters):
            if rank == pair[0]:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
            else:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)
        launch_env.sync_device(device)
        best = max(best, 2 * buffer.numel() * 4 * iters / (time.perf_counter() - start))
    return best


def measure(device: str, hosts_of: list[str] | None, nbytes: int, iters: int) -> dict:
    """Collective (every rank): {"ranks": [[rank, host, gemm FLOP/s], ...], "pairs": [[host, host, bytes/s],
    ...]}; `hosts_of`: the planned host of each rank, where SLURM does not say (SLURMD_NODENAME)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("SLURMD_NODENAME") or (hosts_of[rank] if hosts_of else "localhost")
    if device == "cuda":  # every GPU its own
        gemm = gemm_flops(device, iters)
    else:  # CPU ranks share a node's cores: each multiplies alone, in turn, or they would measure each other
        for turn in range(world):
            if turn == rank:
                gemm = gemm_flops(device, iters)
            dist.barrier()
    ranks = [None] * world
    dist.all_gather_object(ranks, [rank, host, gemm])
    leaders = list({h: r for r, h, _ in reversed(ranks)}.values())[::-1]  # each node's first rank, in node order
    pairs = []
    for round_ in rounds(sorted(leaders)):
        mine = next((pair for pair in round_ if rank in pair), None)
        rate = ping_pong(rank, mine, nbytes, iters, device) if mine else None
        rates = [None] * world
        dist.all_gather_object(rates, rate)
        pairs += [[ranks[a][1], ranks[b][1], rates[a]] for a, b in round_]
    return {"ranks": ranks, "pairs": pairs}


def check(device: str, backend: str, hosts_of: list[str] | None, nbytes: int, iters: int, timeout_s: float,
          out_dir: Path) -> dict:
    """Join the ranks, measure, part (train.job.probe does likewise; a run's job then joins again to train)."""
    env = launch_env.detect()
    device = launch_env.pick_device(device)
    if device == "cpu":
        launch_env.limit_cpu_threads(env)
    launch_env.init(env, device, backend, out_dir, timeout_s)
    found = measure(device, hosts_of, nbytes, iters)
    launch_env.shutdown(env, out_dir)
    return {"device": device, "bytes": nbytes, "iters": iters, "rank": env.rank, **found}


def run(device: str, backend: str, hosts_of: list[str] | None, nbytes: int, iters: int, timeout_s: float,
        out_path: str) -> None:
    """The preflight as its own job (action=preflight): rank 0 writes what every rank found to `out_path`."""
    found = check(device, backend, hosts_of, nbytes, iters, timeout_s, Path(out_path).parent)
    if found.pop("rank") == 0:
        write_atomic(Path(out_path), json.dumps(found) + "\n")
    leave_when_the_task_ends()
