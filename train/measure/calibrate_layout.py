"""Compute of a layout, measured in place by the probe: every run's, pp = tp = 1 included.

A layout with tp or pp above 1 computes with collectives inside: tensor-parallel all-reduces in every layer,
activations sent between stages, a schedule's bubble. Priced from bare-collective fits and compute / (pp x tp),
such steps came out up to 71 % too short on the testbed (results/testbed/validation_model_parallel): on gloo every
tensor-parallel collective blocks its rank inside DTensor's dispatch, which no fit of bare collectives sees.
So the probe runs the layout's own stage step: every rank of the job at once (ranks sharing a node's cores slow
each other as in training), in a mesh (dp, 1, pp, tp) whose data-parallel ranks are each their own shard group
(as train.measure.calibrate), at the run's batch per data-parallel rank, microbatches, schedule, precision and sequence
parallelism. Stages of 1, 2 and 3 decoder layers step in turn, in rounds (train.measure.calibrate.rounds: time-boxed
by probe.budget_s, each round a Theil-Sen line over the depths): the slope prices each further layer of a stage, so a
model of any depth is priced at ceil(L / pp) layers per stage without building it, and noise widens its interval
instead of stopping the probe. Without pipeline stages one stage of 3 layers is built and run at each depth (as
train.measure.calibrate does); with them a stage per depth.
The data-parallel collectives (FSDP over S, HSDP's replicate group, FedAvg) stay out: the step-time model prices
them per level as before. A layout with pp = tp = 1 is measured the same way (a stage is then the whole model),
so every run's compute is timed at its own batch, depth slices and contention (issue 41: priced from
train.measure.calibrate's 0- and 1-layer models, FL+FSDP's compute-bound steps came out up to half short).
"""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from train import model as models
from train.contract.config import TrainConfig
from train.measure import robust
from train.measure.calibrate import (
    BUDGET_S,
    MIN_ROUNDS,
    PROBE_REDUCE_DTYPE,
    at_depth,
    fitted,
    narrow_enough,
    rounds,
    unresolved,
)
from train.parallel import parallelize, pipeline
from train.runtime.launch_env import sync_device

DEPTHS = (1, 2, 3)  # decoder layers per stage of the steps timed


class _Stage:
    """One rank's part of a model of `depth` layers per stage, parallelised as training parallelises it, with its
    AdamW and a batch shared by its tensor-parallel group."""

    def __init__(self, layout: dict, depth: int, mesh, device: str):
        P = layout["pp"]
        config = models.llama_config({**copy.deepcopy(layout["model"]), "num_hidden_layers": P * depth})
        cfg = TrainConfig(precision=layout["precision"], reduce_dtype=PROBE_REDUCE_DTYPE[layout["precision"]],
                          sequence_parallel=layout["sequence_parallel"],
                          activation_checkpointing=layout.get("activation_checkpointing", "none"),
                          compile=layout.get("compile", False))
        model = parallelize.parallelize(models.build(config, "meta"), mesh, mesh["alone"], cfg)
        parallelize.materialize(model, device, seed=0, shard_index=0, tp_index=mesh["tp"].get_local_rank())
        self.model, self.device = model, device
        self.pipeline = (pipeline.Pipeline(model, mesh, layout["microbatches"], layout["pp_schedule"], device,
                                           layout["batch_per_rank"], layout["seq_len"], layout["precision"])
                         if P > 1 else None)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)  # the same ids on every rank: a tensor group shares them
        self.ids = torch.randint(0, config.vocab_size, (layout["batch_per_rank"], layout["seq_len"]),
                                 generator=generator).to(device)
        self.params = sum(parallelize.local(p).numel() for p in model.parameters())

    def step(self) -> tuple[float, float, float]:
        """Forward, backward and optimizer seconds of one step; under pp the schedule interleaves forwards and
        backwards, so both count as forward (as train.loop's phase timing records them)."""
        start = time.perf_counter()
        if self.pipeline is None:
            loss = self.model(input_ids=self.ids, labels=self.ids).loss
            sync_device(self.device)
            forward = time.perf_counter()
            loss.backward()
        else:
            self.pipeline.step(self.ids)
        sync_device(self.device)
        backward = time.perf_counter()
        if self.pipeline is not None:
            forward = backward
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sync_device(self.device)
        return forward - start, backward - forward, time.perf_counter() - backward


def _measure(layout: dict, mesh, device: str, iters: int, budget_s: float) -> dict:
    """The stage's steps at every depth in rounds, fitted (train.measure.calibrate.fitted): `one` is a stage of one
    layer, `layer` each further layer; the optimizer is shared out by each rank's parameter count, as
    train.measure.calibrate does."""
    if layout["pp"] == 1:  # one stage, run at each depth
        stage = _Stage(layout, max(DEPTHS), mesh, device)
        layer = sum(parallelize.local(p).numel() for p in stage.model.model.layers[0].parameters())
        params = [stage.params - (max(DEPTHS) - d) * layer for d in DEPTHS]
        steps = [at_depth(stage.model, d, stage.step) for d in DEPTHS]
    else:
        stages = [_Stage(layout, depth, mesh, device) for depth in DEPTHS]
        params, steps = [s.params for s in stages], [s.step for s in stages]
    largest = torch.tensor(params, dtype=torch.float64, device=device)  # the largest stage's, as the slowest rank's
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    params = largest.tolist()
    used: list = []
    done, seconds = rounds(steps, device, budget_s, max(iters, MIN_ROUNDS), narrow_enough(DEPTHS, params), used)
    n = -(-layout["model"]["num_hidden_layers"] // layout["pp"])
    fit = fitted(DEPTHS, done, params, 1, n)
    interval = {"one": fit["interval"]["base"], "layer": fit["interval"]["layer"]}
    one = fit.pop("base")
    return {**layout, "one": one, **fit, "interval": interval, "seconds": seconds, "cpu": cpu_line(used)}


def cpu_line(used: list) -> dict:
    """{"one", "layer"}: the mean rank's CPU seconds in a stage step of one layer and for each further layer, the
    medians over rounds of each round's Theil-Sen line over DEPTHS."""
    lines = [robust.theil_sen(list(DEPTHS), r) for r in used]
    return {"one": robust.median([intercept + slope for slope, intercept in lines]),
            "layer": robust.median([slope for slope, _ in lines])}


def calibrate_layouts(rank: int, layouts: list[dict], device: str = "cpu", iters: int = 3, budget_s: float = BUDGET_S,
                      progress=None) -> list[dict]:
    """[{**layout, "one": {phase: s}, "layer": {phase: s}, "interval": {"one"|"layer": {phase: [low, high]}},
    "resolved", "whole", "spread", "depths", "rounds", "by_depth", "seconds", "cpu": {"one", "layer"}}] for
    layouts {model, batch_per_rank (per data-parallel rank), seq_len, precision, pp, tp, microbatches, pp_schedule,
    sequence_parallel}: a stage of n layers takes one + (n - 1) x layer, the slowest rank's seconds (`cpu`: the
    mean rank's CPU seconds, cpu_line). A layout whose pp x tp does not divide the job's ranks is skipped (the
    step-time model prices it from its parts). Every rank must call it with the same arguments."""
    world, out = dist.get_world_size(), []
    for layout in layouts:
        P, T = layout["pp"], layout["tp"]
        if world % (P * T):
            continue
        mesh = init_device_mesh(device, (world // (P * T), 1, P, T),
                                mesh_dim_names=("calibrating", "alone", "pp", "tp"))
        out.append(_measure(layout, mesh, device, iters, budget_s))
        if progress is not None and rank == 0:
            e = out[-1]
            progress(f"probe: compute of layout pp={P} tp={T} at {layout['batch_per_rank']}x{layout['seq_len']} "
                     f"tokens done: forward+backward within ±{e['spread']['forward_backward']:.1%} over "
                     f"{e['rounds']} rounds of {len(DEPTHS)} depths in {e['seconds']:.1f} s{unresolved(e)}")
    return out
