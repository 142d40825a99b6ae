"""Compute of a layout, measured in place by the probe: every run's, pp = tp = 1 included.

A layout with tp or pp above 1 computes with collectives inside: tensor-parallel all-reduces in every layer,
activations sent between stages, a schedule's bubble. Priced from bare-collective fits and compute / (pp x tp),
such steps came out up to 71 % too short on the testbed (results/testbed/validation_model_parallel): on gloo every
tensor-parallel collective blocks its rank inside DTensor's dispatch, which no fit of bare collectives sees.
So the probe runs the layout's own stage step: every rank of the job at once (ranks sharing a node's cores slow
each other as in training), in a mesh (dp, 1, pp, tp) whose data-parallel ranks are each their own shard group
(as train.measure.calibrate), at the run's batch per data-parallel rank, microbatches, schedule, precision and sequence
parallelism. Two depths, 1 and 2 decoder layers per stage, step in turn: their difference prices each further
layer of a stage, so a model of any depth is priced at ceil(L / pp) layers per stage without building it.
The data-parallel collectives (FSDP over S, HSDP's replicate group, FedAvg) stay out: the step-time model prices
them per level as before. A layout with pp = tp = 1 is measured the same way (a stage is then the whole model),
so every run's compute is timed at its own batch, depth slices and contention (issue 41: priced from
train.measure.calibrate's 0- and 1-layer models, FL+FSDP's compute-bound steps came out up to half short).
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from train import model as models
from train.contract.config import TrainConfig
from train.measure.calibrate import PHASES, PROBE_REDUCE_DTYPE, CalibrationError, in_turn, spread
from train.parallel import parallelize, pipeline
from train.runtime.launch_env import sync_device

DEPTHS = (1, 2)  # decoder layers per stage of the two models timed


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


def _measure_once(layout: dict, mesh, device: str, iters: int, tries: int) -> tuple[list[float], list[float]]:
    """(one, layer): the slowest rank's phase seconds of a stage of one layer, and of each further layer. The
    optimizer is shared out by each rank's parameter count, as train.measure.calibrate does; re-measured up to `tries`
    times while a further layer's forward + backward comes out zero or negative, then an error."""
    pair = [_Stage(layout, depth, mesh, device) for depth in DEPTHS]
    for _ in range(tries):
        one, two = in_turn([stage.step for stage in pair], iters, device)
        p1, p2 = pair[0].params, pair[1].params
        rate = (one[2] + two[2]) / (p1 + p2)  # seconds per parameter of this rank's AdamW step
        mine = torch.tensor([one[0], one[1], rate * p1, two[0] - one[0], two[1] - one[1], rate * (p2 - p1)],
                            dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        first, layer = mine[:3].tolist(), mine[3:].tolist()
        if layer[0] + layer[1] > 0:
            return first, layer
    raise CalibrationError(f"probe: compute of layout pp={layout['pp']} tp={layout['tp']} at "
                           f"{layout['batch_per_rank']}x{layout['seq_len']} tokens: a stage of {DEPTHS[1]} layers "
                           f"was not slower than one of {DEPTHS[0]} in {tries} tries: the work is below this "
                           f"machine's timing noise; raise probe.iters or the run's batch_per_rank or seq_len")


def calibrate_layouts(rank: int, layouts: list[dict], device: str = "cpu", iters: int = 3, repeats: int = 5,
                      progress=None, tries: int = 3) -> list[dict]:
    """[{**layout, "one": {phase: s}, "layer": {phase: s}, "repeats": [...], "spread": {...}}] for layouts
    {model, batch_per_rank (per data-parallel rank), seq_len, precision, pp, tp, microbatches, pp_schedule,
    sequence_parallel}: a stage of n layers takes one + (n - 1) x layer. Medians over `repeats`, as
    train.measure.calibrate. A layout whose pp x tp does not divide the job's ranks is skipped (the step-time model
    prices it from its parts). Every rank must call it with the same arguments."""
    world, out = dist.get_world_size(), []
    for layout in layouts:
        P, T = layout["pp"], layout["tp"]
        if world % (P * T):
            continue
        mesh = init_device_mesh(device, (world // (P * T), 1, P, T),
                                mesh_dim_names=("calibrating", "alone", "pp", "tp"))
        done = [_measure_once(layout, mesh, device, iters, tries) for _ in range(repeats)]
        n = -(-layout["model"]["num_hidden_layers"] // P)
        whole = [[first[k] + (n - 1) * layer[k] for k in range(3)] for first, layer in done]
        median = lambda part: dict(zip(PHASES, (statistics.median(d[part][k] for d in done)  # noqa: E731
                                                for k in range(3))))
        out.append({**layout, "one": median(0), "layer": median(1),
                    "repeats": [{"one": dict(zip(PHASES, first)), "layer": dict(zip(PHASES, layer))}
                                for first, layer in done],
                    "spread": {"forward_backward": spread([x[0] + x[1] for x in whole])}})
        if progress is not None and rank == 0:
            progress(f"probe: compute of layout pp={P} tp={T} at {layout['batch_per_rank']}x{layout['seq_len']} "
                     f"tokens done: forward+backward within ±{out[-1]['spread']['forward_backward']:.1%} over "
                     f"{repeats} repeats")
    return out

