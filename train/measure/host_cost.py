"""Host overhead, measured by the probe: what a step and each collective cost besides the arithmetic and the wire.

Issue 54, item 4: on 8 ranks sharing 2 cores a step carries CPU time the step-time model never priced: FSDP2's hooks
and copies around each collective, the optimizer's dispatch, gloo's own work. Two measurements give it:
- `collective_seconds`: each collective on a one-rank group (no wire, no peer to wait for), a single fp32
  element, called many times: what issuing and completing one call costs the host;
- `zero_layer_steps`: a model of 0 decoder layers (the root units: embeddings, lm_head) stepped with the collectives
  of a run's layout on (its mesh: FSDP over S, HSDP's replicas over R, every group at once, in copies that fill the
  probe's world) and, in turn, sharded on a one-rank group (collectives off); the paired difference per round is
  what the root units' collectives cost the step, wire and host together, and the 0-layer step itself the part of
  a step that does not grow with depth.
Every rank returns the same numbers (the slowest rank's, train.measure.calibrate.rounds).
"""
from __future__ import annotations

import copy
import math
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from train import model as models
from train.contract.config import TrainConfig
from train.contract.layout import NAMES
from train.measure import robust
from train.measure.calibrate import MIN_ROUNDS, PHASES, PROBE_REDUCE_DTYPE, _build, _step, rounds
from train.measure.probe import _run
from train.parallel import mesh as meshes
from train.parallel import parallelize
from train.runtime import launch_env

CALLS_S = 0.1      # each collective is called for at least this long
MAX_CALLS = 1000


def collective_seconds(collectives: tuple[str, ...], device: str = "cpu") -> dict:
    """{collective: {median_s, interval_s: [low, high] (95 %), calls}}: the host's seconds issuing one call of one
    fp32 element on a one-rank group (on CUDA not waiting for the device: the model compares the host's time with
    the device's), the slowest rank's median over as many calls as last CALLS_S (at least 20; `calls`: the most a
    rank made). Every rank must call it."""
    world = dist.get_world_size()
    alone = init_device_mesh(device, (world, 1), mesh_dim_names=("host", "alone"))["alone"].get_group()
    out = {}
    for collective in collectives:
        buf = torch.ones(1, dtype=torch.float32, device=device)
        _run(collective, buf, alone, 1)  # warm-up
        start = time.perf_counter()
        _run(collective, buf, alone, 1)
        once = time.perf_counter() - start
        count = min(MAX_CALLS, max(20, math.ceil(CALLS_S / max(once, 1e-9))))
        times = []
        for _ in range(count):  # the host's seconds issuing a call: on CUDA the device's own time is not waited for
            start = time.perf_counter()
            _run(collective, buf, alone, 1)
            times.append(time.perf_counter() - start)
        launch_env.sync_device(device)  # the calls done before the ranks compare
        lo, hi = robust.median_interval(times)
        slowest = torch.tensor([statistics.median(times), lo, hi, count], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        median, lo, hi, most = slowest.tolist()
        out[collective] = {"median_s": median, "interval_s": [lo, hi], "calls": int(most)}
    return out


def _with_collectives(spec: dict, device: str):
    """A 0-layer model parallelised over the layout of `spec` as training does (train.parallel.parallelize), in
    world / (F x R x S) copies of its mesh, with its AdamW and a batch."""
    F, R, S = spec["F"], spec["R"], spec["S"]
    copies = dist.get_world_size() // (F * R * S)
    mesh = init_device_mesh(device, (copies, F, R, S, 1, 1), mesh_dim_names=("copies", *NAMES))
    config = models.llama_config({**copy.deepcopy(spec["model"]), "num_hidden_layers": 0})
    cfg = TrainConfig(precision=spec["precision"], reduce_dtype=PROBE_REDUCE_DTYPE[spec["precision"]])
    model = parallelize.parallelize(models.build(config, "meta"), mesh, meshes.data_parallel_mesh(mesh,
                                                                                                  spec["strategy"]),
                                    cfg)
    parallelize.materialize(model, device, seed=0, shard_index=mesh["shard"].get_local_rank())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (spec["batch_per_rank"], spec["seq_len"]), generator=generator)
    return model, optimizer, ids.to(device), copies


def _zero_layer_step(spec: dict, device: str, iters: int, budget_s: float, alone) -> dict:
    """One layout's 0-layer step with its collectives on and off, in rounds; phases per round paired."""
    on, on_opt, on_ids, copies = _with_collectives(spec, device)
    off = _build(spec["model"], 0, spec["batch_per_rank"], spec["seq_len"], spec["precision"], device, alone)
    done, seconds = rounds([lambda: _step(on, on_opt, on_ids, device), lambda: _step(*off, device)], device, budget_s,
                           max(iters, MIN_ROUNDS))
    parts = {"on": [r[0] for r in done], "off": [r[1] for r in done],
             "collectives": [[a - b for a, b in zip(r[0], r[1])] for r in done]}
    summaries = {part: {**{k: robust.summary([x[i] for x in xs]) for i, k in enumerate(PHASES)},
                        "step_s": robust.summary([sum(x) for x in xs])} for part, xs in parts.items()}
    return {**spec, "copies": copies, "rounds": len(done), "seconds": seconds,
            **{part: {k: s["median"] for k, s in by.items()} for part, by in summaries.items()},
            "interval": {part: {k: s["interval"] for k, s in by.items()} for part, by in summaries.items()}}


def zero_layer_steps(rank: int, specs: list[dict], device: str = "cpu", iters: int = 3, budget_s: float = 10.0,
                     progress=None) -> list[dict]:
    """[{**spec, copies, on, off, collectives: {forward_s, backward_s, optimizer_s, step_s}, interval: {on | off |
    collectives: {phase: [low, high]}}, rounds, seconds}] for specs {model, batch_per_rank, seq_len, precision,
    strategy, F, R, S} (a run's workload and data-parallel layout): `on` the 0-layer step with the layout's
    collectives, `off` on a one-rank group, `collectives` their paired difference, medians over rounds with 95 %
    intervals. A layout whose F x R x S does not divide the probe's ranks is skipped. Every rank must call it with
    the same specs."""
    world, out = dist.get_world_size(), []
    alone = init_device_mesh(device, (world, 1), mesh_dim_names=("zero", "alone"))["alone"]
    for spec in specs:
        if world % (spec["F"] * spec["R"] * spec["S"]):
            continue
        out.append(_zero_layer_step(spec, device, iters, budget_s, alone))
        if progress is not None and rank == 0:
            e = out[-1]
            progress(f"probe: 0-layer step of {spec['strategy']} ({spec['F']},{spec['R']},{spec['S']}) at "
                     f"{spec['batch_per_rank']}x{spec['seq_len']} tokens done: {e['on']['step_s'] * 1e3:.2f} ms with "
                     f"its collectives, {e['off']['step_s'] * 1e3:.2f} ms without, over {e['rounds']} rounds")
    return out
