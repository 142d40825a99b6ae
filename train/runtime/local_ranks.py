"""Run a function on N local processes joined by gloo (the tests and benchmarks); each returns a picklable value.

The processes fork from a forkserver that has imported torch, transformers and the trainer once: spawning
each rank afresh costs ~5 s of imports, more than most tests' training on 2 cores. The forkserver starts
on first use and keeps that moment's environment, so a rank's settings are passed as arguments, never
through os.environ."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from train.contract.common import free_port
from train.runtime.ending import leave_without_finalization

PRELOAD = ("train.loop",)  # imports torch, torch.distributed's FSDP2/DTensor/checkpoint and transformers' Llama


def _entry(rank: int, fn, world: int, port: int, out_dir: str, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)  # torch read OMP_NUM_THREADS before we could set it
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        value = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"{rank}.pkl").write_bytes(pickle.dumps(value))
    leave_without_finalization(0)


def run_ranks(fn, world: int, *args, preload: tuple[str, ...] = PRELOAD) -> list:
    """fn(rank, world, *args) on `world` processes forked from the forkserver; returns their values in rank order.
    `preload`: the modules the forkserver imports when this call starts it (one already running keeps its own)."""
    with tempfile.TemporaryDirectory() as out_dir:
        multiprocessing.set_forkserver_preload(list(preload))
        mp.start_processes(_entry, args=(fn, world, free_port(), out_dir, args), nprocs=world, join=True,
                           start_method="forkserver")
        return [pickle.loads(Path(out_dir, f"{r}.pkl").read_bytes()) for r in range(world)]
