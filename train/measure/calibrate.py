"""Compute calibration for the step-time model: one rank's forward, backward and AdamW step at a run's batch.

Every rank of the probe job measures at once, as training computes (ranks sharing a node's CPUs or memory
bandwidth slow each other as they do in a step). One model of max(DEPTHS) decoder layers is built and stepped at
each depth in turn (transformers runs the first config.num_hidden_layers layers; the others stay idle, their
gradients None, so the optimizer skips them too): a layer's cost is the slope over the layer counts and the root's
(embeddings, lm_head) the intercept, so a model of any depth is priced without building it whole (Llama-3.1-8B's
4-layer slice has 1.9 B parameters, ~31 GB with fp32 AdamW state, against 8 B).
The steps are timed in rounds (one step per depth, in turn, so a passing load falls on all of them) for as long as
probe.budget_s allows or until a layer is known within ±TARGET; each round gives a Theil-Sen line, and the medians
of the rounds' slopes and intercepts with their 95 % distribution-free intervals are what probe.json keeps. Noise
widens the interval: a layer whose interval includes 0 is reported so (`resolved`), never refused (issue 54, item 5:
three samples of a 2-core machine could not separate one layer from none, and the probe stopped).
The model is wrapped by fully_shard exactly as training wraps it (train.parallel.parallelize: each layer, then the
root, with the run's mixed precision), on a shard group of one rank: the timings then carry FSDP2's per-unit
hooks and copies and the optimizer's DTensor dispatch, which on a small model cost more than its arithmetic,
while the collectives themselves, priced per level by the probe, stay out.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from train import model as models
from train.measure import robust
from train.parallel import parallelize
from train.runtime.launch_env import sync_device

PHASES = ("forward_s", "backward_s", "optimizer_s")
DEPTHS = (0, 1, 2, 4)  # decoder layers of the steps timed: a layer is the slope over them
BUDGET_S = 10.0  # seconds a calibration may keep measuring (probe.budget_s)
MIN_ROUNDS = 9   # fewer, and a median's 95 % interval is the whole range of the rounds
MAX_ROUNDS = 2000
TARGET = 0.05    # a calibration stops before its budget once a layer's forward+backward is known within ±5 %


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


def at_depth(model, depth: int, step):
    """`step` (a callable timing one training step of `model`) run with the model's first `depth` layers only."""
    def timed():
        model.config.num_hidden_layers = depth
        return step()
    return timed


def rounds(steps: list, device: str, budget_s: float, min_rounds: int = MIN_ROUNDS,
           narrow=None, cpu: list | None = None) -> tuple[list, float]:
    """([round][k]: the phase seconds of steps[k] (callables timing one training step each) in each round, the
    slowest rank's; the seconds the rounds took, the slowest rank's). A round steps each once, in turn (in reverse
    every other round, so none always comes first after a pause), each started at a barrier, after one warm-up step
    each (it allocates AdamW's state: not counted); so a passing load (another process, a neighbour's burst) falls
    on all alike and their differences keep their sign.
    Rounds go on until `budget_s` has passed (on the slowest rank) and at least `min_rounds` are done, or, after
    `min_rounds`, until `narrow(rounds)` says the estimate is tight enough; every rank runs the same rounds and
    returns the same numbers. `cpu`, when given, gets each round's [k]: the mean rank's CPU seconds in steps[k] (its
    process's, every thread): what ranks sharing cores cost each other when none waits for another (issue 54)."""
    dist.barrier()
    for step in steps:
        step()
    done: list = []
    started = time.perf_counter()
    while True:
        mine: list = [None] * len(steps)
        used = [0.0] * len(steps)
        for k in (range(len(steps)) if len(done) % 2 == 0 else reversed(range(len(steps)))):
            dist.barrier()
            before = time.process_time()
            mine[k] = list(steps[k]())
            used[k] = time.process_time() - before
        slowest = torch.tensor([t for m in mine for t in m] + [time.perf_counter() - started], dtype=torch.float64,
                               device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        values = slowest.tolist()
        width = len(mine[0])
        done.append([values[k * width:(k + 1) * width] for k in range(len(steps))])
        if cpu is not None:  # the probe's rounds, never a training step: one more small sum after the timed steps,
            # read on the host (.tolist()) because the fit is plain Python; a SUM cannot share the MAX above
            total = torch.tensor(used, dtype=torch.float64, device=device)
            dist.all_reduce(total)
            cpu.append((total / dist.get_world_size()).tolist())
        n = len(done)
        if n >= MAX_ROUNDS or (n >= min_rounds and (values[-1] >= budget_s or (narrow is not None and narrow(done)))):
            return done, values[-1]


def lines(depths: tuple, done: list, params: list[float]) -> dict[str, list[tuple[float, float]]]:
    """{phase, and "forward_backward": [(intercept, slope) per round]}: each round's Theil-Sen line of its seconds
    over the layer counts. AdamW's step is an elementwise pass over every parameter, and a layer adds too little
    of it to stand out of the noise by difference (on 2 CPU cores the `small` preset's 2-layer step measured
    11.90 ms against the 1-layer's 12.05 ms): each round's seconds per parameter, pooled over its depths, are shared
    out by parameter count (`params`: the parameters stepped at each depth)."""
    per_layer = (params[-1] - params[0]) / (depths[-1] - depths[0])
    fixed = params[0] - depths[0] * per_layer
    out: dict[str, list] = {p: [] for p in (*PHASES, "forward_backward")}
    def line(ys: list[float]) -> tuple[float, float]:
        slope, intercept = robust.theil_sen(depths, ys)
        return intercept, slope

    for r in done:
        for i, phase in enumerate(PHASES[:2]):
            out[phase].append(line([s[i] for s in r]))
        out["forward_backward"].append(line([s[0] + s[1] for s in r]))
        rate = sum(s[2] for s in r) / sum(params)
        out["optimizer_s"].append((rate * fixed, rate * per_layer))
    return out


def at(line: list[tuple[float, float]], depth: float) -> dict:
    """robust.summary of each round's line at `depth` layers."""
    return robust.summary([a + depth * b for a, b in line])


def narrow_enough(depths: tuple, params: list[float]):
    """A stop rule for rounds(): a layer's forward+backward above 0 and known within ±TARGET."""
    slopes: list[float] = []  # each round's, fitted once

    def narrow(done: list) -> bool:
        slopes.extend(b for _, b in lines(depths, done[len(slopes):], params)["forward_backward"])
        n = len(done)
        if n % 4 or (n > 64 and n % 32):  # checked every 4th round, then every 32nd: the check stays cheap
            return False
        s = robust.summary(slopes)
        lo, hi = s["interval"]
        return lo > 0 and (hi - lo) / 2 <= TARGET * s["median"]
    return narrow


def fitted(depths: tuple, done: list, params: list[float], base: int, at_depth_of_model: int) -> dict:
    """What probe.json keeps of a calibration: per phase the median over rounds of the line at `base` layers
    (0: the root; 1: a stage of one layer) and of its slope (a layer), each with its 95 % interval; whether each
    layer slope's interval excludes 0 (`resolved`); the whole model at its depth with its spread (half the
    interval over the median); the medians per depth; how many rounds."""
    fits = lines(depths, done, params)
    keys = (*PHASES, "forward_backward")
    base_s = {k: at(fits[k], base) for k in keys}
    layer_s = {k: robust.summary([b for _, b in fits[k]]) for k in keys}
    whole = {k: at(fits[k], at_depth_of_model) for k in keys}
    return {"base": {k: base_s[k]["median"] for k in PHASES}, "layer": {k: layer_s[k]["median"] for k in PHASES},
            "interval": {"base": {k: base_s[k]["interval"] for k in keys},
                         "layer": {k: layer_s[k]["interval"] for k in keys}},
            "resolved": {k: robust.resolved(layer_s[k]["interval"]) for k in ("forward_s", "backward_s",
                                                                             "forward_backward")},
            "whole": {k: whole[k]["median"] for k in keys},
            "spread": {k: _spread(whole[k]) for k in keys},
            "depths": list(depths), "rounds": len(done),
            "by_depth": {str(d): dict(zip(PHASES, (statistics.median(r[i][k] for r in done) for k in range(3))))
                         for i, d in enumerate(depths)}}


def _spread(s: dict) -> float:
    """Half an interval's width over its median: how far a calibration's estimate may stray."""
    lo, hi = s["interval"]
    return (hi - lo) / 2 / abs(s["median"]) if s["median"] else float("inf")


def unresolved(entry: dict) -> str:
    """'' when a layer's forward+backward is certainly above 0, else what the progress line says instead."""
    if entry["resolved"]["forward_backward"]:
        return ""
    lo, hi = entry["interval"]["layer"]["forward_backward"]
    return (f"; a layer's forward+backward is not resolved from this machine's noise (95 % interval "
            f"{lo * 1e3:.2f} to {hi * 1e3:.2f} ms includes 0): priced at its median, raise probe.budget_s")


def _calibrate_one(w: dict, device: str, iters: int, budget_s: float, alone) -> dict:
    """One workload: its model of max(DEPTHS) layers stepped at every depth in rounds, fitted."""
    model, optimizer, ids = _build(w["model"], max(DEPTHS), w["batch_per_rank"], w["seq_len"], w["precision"], device,
                                   alone)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    root = models.count_params(model) - max(DEPTHS) * layer
    params = [float(root + d * layer) for d in DEPTHS]
    step = lambda: _step(model, optimizer, ids, device)  # noqa: E731
    done, seconds = rounds([at_depth(model, d, step) for d in DEPTHS], device, budget_s, max(iters, MIN_ROUNDS),
                  narrow_enough(DEPTHS, params))
    fit = fitted(DEPTHS, done, params, 0, w["model"]["num_hidden_layers"])
    interval = {"root": fit["interval"]["base"], "layer": fit["interval"]["layer"]}
    measured = fit.pop("base")
    return {**w, "root": measured, **fit, "interval": interval, "seconds": seconds}


def calibrate(rank: int, workloads: list[dict], device: str = "cpu", iters: int = 3, budget_s: float = BUDGET_S,
              progress=None) -> list[dict]:
    """[{**workload, "root": {phase: s}, "layer": {phase: s}, "interval": {"root"|"layer": {phase: [low, high]}},
    "resolved", "whole", "spread", "depths", "rounds", "by_depth", "seconds"}] for workloads {model,
    batch_per_rank, seq_len, precision} (fitted: the keys' meaning). At least max(iters, MIN_ROUNDS) rounds, then
    as many as budget_s allows or until a layer is known within ±TARGET. Every rank must call it with the same
    arguments, and every rank returns the same numbers (the slowest rank's steps)."""
    out = []
    # every rank its own shard group: (world, 1) from init_device_mesh, never a hand-built rank array
    alone = init_device_mesh(device, (dist.get_world_size(), 1), mesh_dim_names=("calibrating", "alone"))["alone"]
    for w in workloads:
        out.append(_calibrate_one(w, device, iters, budget_s, alone))
        if progress is not None and rank == 0:
            e = out[-1]
            progress(f"probe: compute of {w['model']['num_hidden_layers']}-layer model at {w['batch_per_rank']}x"
                     f"{w['seq_len']} tokens ({w['precision']}) done: forward+backward within "
                     f"±{e['spread']['forward_backward']:.1%} over {e['rounds']} rounds of {len(DEPTHS)} depths in "
                     f"{e['seconds']:.1f} s{unresolved(e)}")
    return out
