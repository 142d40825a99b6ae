"""Compute calibration for the step-time model: one rank's forward, backward and AdamW step at a run's batch.

Every rank of the probe job measures at once, as training computes (ranks sharing a node's CPUs or memory
bandwidth slow each other as they do in a step). Models with 0 and 1 decoder layers are timed, step by step in
turn (so a passing load falls on both): the root
(embeddings, lm_head) and one layer separate and a model of any depth is priced without building it whole
(Llama-3.1-8B's one-layer slice has 1.3 B parameters, ~20 GB with fp32 AdamW state, against 8 B).
The calibration is repeated and reported with its spread, so a prediction says how repeatable its compute is;
a layer or root that comes out zero or negative is re-measured, then refused, never clamped.
Both models are wrapped by fully_shard exactly as training wraps them (train.parallel.parallelize: each layer, then the
root, with the run's mixed precision), on a shard group of one rank: the timings then carry FSDP2's per-unit
hooks and copies and the optimizer's DTensor dispatch, which on a small model cost more than its arithmetic,
while the collectives themselves, priced per level by the probe, stay out.
"""
from __future__ import annotations

import copy
import functools
import math
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from train import model as models
from train.contract.common import FedshardError
from train.parallel import parallelize
from train.runtime.launch_env import sync_device

PHASES = ("forward_s", "backward_s", "optimizer_s")


MIN_TIMED_S = 0.2  # each timing runs enough steps to last this long: a tiny model's millisecond phases are
MAX_ITERS = 500   # otherwise below a shared machine's noise (and a layer could come out cheaper than nothing)


def _step(model, optimizer, ids, device: str) -> tuple[float, float, float]:
    """Forward, backward and optimizer seconds of one training step."""
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    sync_device(device)
    forward = time.perf_counter()
    loss.backward()
    sync_device(device)
    backward = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync_device(device)
    return forward - start, backward - forward, time.perf_counter() - backward


# A one-rank probe reduces nothing across ranks, but FSDP still casts gradients to the reduce dtype: as the
# presets of each precision do (train=paper: the authors' bf16).
PROBE_REDUCE_DTYPE = {"fp32": "fp32", "bf16": "fp32", "paper": "bf16"}


def _build(llama_kwargs: dict, layers: int, batch: int, seq_len: int, precision: str, device: str, alone):
    """A `layers`-layer model sharded over the one-rank mesh `alone`, its AdamW and a batch of ids."""
    # a copy: LlamaConfig edits nested dicts (rope_scaling) in place, and the workload must stay as the plan sent it
    config = models.llama_config({**copy.deepcopy(llama_kwargs), "num_hidden_layers": layers})
    model = parallelize.shard(models.build(config, device), alone, precision, PROBE_REDUCE_DTYPE[precision])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), device=device)
    return model, optimizer, ids


def in_turn(steps: list, iters: int, device: str) -> list[list[float]]:
    """Median phase seconds of each of `steps` (callables timing one training step each), over at least `iters`
    steps and as many as last MIN_TIMED_S. They step in turn, so a passing load (another process, a neighbour's
    burst) slows all alike and their differences keep their sign; every rank runs the same number of steps, each
    started at a barrier, after one warm-up step each (it allocates AdamW's state: not counted)."""
    dist.barrier()
    warm = sum(sum(step()) for step in steps)
    count = torch.tensor([min(MAX_ITERS, max(iters, math.ceil(MIN_TIMED_S / max(warm, 1e-9))))], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    samples: list[list] = [[] for _ in steps]
    for _ in range(int(count.item())):
        for k, step in enumerate(steps):
            dist.barrier()
            samples[k].append(step())
    return [[statistics.median(s[k] for s in runs) for k in range(len(runs[0]))] for runs in samples]


def _time_pair(llama_kwargs: dict, batch: int, seq_len: int, precision: str, device: str,
               iters: int, alone) -> tuple[tuple[list[float], int], tuple[list[float], int]]:
    """((median forward, backward and optimizer seconds, parameters) of the 0-layer model (the root alone), the
    same of the 1-layer model), stepped in turn (in_turn)."""
    pair = [_build(llama_kwargs, layers, batch, seq_len, precision, device, alone) for layers in (0, 1)]
    one, two = in_turn([functools.partial(_step, m, o, ids, device) for m, o, ids in pair], iters, device)
    return (one, models.count_params(pair[0][0])), (two, models.count_params(pair[1][0]))


class CalibrationError(FedshardError):
    """Forward or backward did not grow from the 0-layer to the 1-layer model,
    re-measured and still so: the measurement is below the machine's noise and would price a layer at nothing."""


def _split(one: list[float], two: list[float], params: tuple[int, int]) -> tuple[list[float], list[float]] | None:
    """(root, layer) per phase from the 0- and 1-layer timings (the root is measured alone, so it is never below
    zero); None when a part is not positive. Forward and
    backward split by difference. AdamW's step is an elementwise pass over every parameter, and a layer adds too
    little of it to stand out of the noise by difference (on 2 CPU cores the `small` preset's 2-layer step
    measured 11.90 ms against the 1-layer's 12.05 ms): its seconds per parameter, pooled over both models, are
    shared out by parameter count."""
    layer = [b - a for a, b in zip(one[:2], two[:2])]
    root = list(one[:2])
    p1, p2 = params
    rate = (one[2] + two[2]) / (p1 + p2)
    layer.append(rate * (p2 - p1))
    root.append(rate * p1)
    return (root, layer) if min(root + layer) > 0 else None


def _measure_once(w: dict, device: str, iters: int, tries: int, alone) -> tuple[list[float], list[float]]:
    """One calibration of workload w: the slowest rank's 0- and 1-layer medians, split into root and layer;
    re-measured up to `tries` times while a part comes out zero or negative, then an error (never clamped)."""
    for _ in range(tries):
        (one, p1), (two, p2) = _time_pair(w["model"], w["batch_per_rank"], w["seq_len"], w["precision"], device, iters,
                                        alone)
        slowest = torch.tensor(one + two, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        one, two = slowest[:3].tolist(), slowest[3:].tolist()
        parts = _split(one, two, (p1, p2))
        if parts is not None:
            return parts
    raise CalibrationError(f"probe: compute of {w['batch_per_rank']}x{w['seq_len']} tokens ({w['precision']}): the "
                           f"forward or backward of the 1-layer model was not slower than the 0-layer model's in "
                           f"{tries} tries "
                           f"(0 layers {[f'{t * 1e3:.2f}' for t in one]} ms, 1 layer "
                           f"{[f'{t * 1e3:.2f}' for t in two]} ms, forward/backward/optimizer): the work is below "
                           f"this machine's timing noise; raise probe.iters or the run's batch_per_rank or seq_len")


def spread(values: list[float]) -> float:
    """Half the range over the median: how far repeats of one calibration stray from their middle."""
    return (max(values) - min(values)) / 2 / statistics.median(values)


def calibrate(rank: int, workloads: list[dict], device: str = "cpu", iters: int = 3, repeats: int = 5,
              progress=None, tries: int = 3) -> list[dict]:
    """[{**workload, "root": {phase: s}, "layer": {phase: s}, "repeats": [...], "spread": {...}}] for workloads
    {model, batch_per_rank, seq_len, precision}. Each workload is calibrated `repeats` times (each the slowest
    rank's medians over `iters` steps); root and layer are the medians over the repeats, `repeats` keeps every
    one, and `spread` gives, per phase of the whole model at the workload's depth, half the range over the
    median. Every rank must call it with the same arguments."""
    out = []
    # every rank its own shard group: (world, 1) from init_device_mesh, never a hand-built rank array
    alone = init_device_mesh(device, (dist.get_world_size(), 1), mesh_dim_names=("calibrating", "alone"))["alone"]
    for w in workloads:
        done = [_measure_once(w, device, iters, tries, alone) for _ in range(repeats)]
        L = w["model"]["num_hidden_layers"]
        whole = [[root[k] + L * layer[k] for k in range(3)] for root, layer in done]
        out.append({**w, "root": dict(zip(PHASES, (statistics.median(d[0][k] for d in done) for k in range(3)))),
                    "layer": dict(zip(PHASES, (statistics.median(d[1][k] for d in done) for k in range(3)))),
                    "repeats": [{"root": dict(zip(PHASES, root)), "layer": dict(zip(PHASES, layer))}
                                for root, layer in done],
                    "spread": {**dict(zip(PHASES, (spread([x[k] for x in whole]) for k in range(3)))),
                               "forward_backward": spread([x[0] + x[1] for x in whole])}})
        if progress is not None and rank == 0:
            progress(f"probe: compute of {L}-layer model at {w['batch_per_rank']}x{w['seq_len']} tokens "
                     f"({w['precision']}) done: forward+backward within ±{out[-1]['spread']['forward_backward']:.1%} "
                     f"over {repeats} repeats")
    return out
