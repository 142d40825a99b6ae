"""The probe's work on every rank (launcher.actions.probe submits it, like a run): every collective timed across each
topology level, the world barrier, the compute of the sweep's workloads (train.measure.calibrate) and the stage
step of each of its layouts in place (train.measure.calibrate_layout); rank 0 writes them to one raw file. Beside
them (issue 54): the runs' own communicators at their own sizes and pairs of each level's ranks
(train.measure.probe.measure_groups), and the host's cost of a collective and of a 0-layer step with a layout's
collectives on (train.measure.host_cost)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch.distributed as dist

from train.contract.common import write_atomic
from train.contract.layout import seats
from train.contract.machine import describe as describe_machine
from train.measure.calibrate import calibrate
from train.measure.calibrate_layout import calibrate_layouts
from train.measure.host_cost import collective_seconds, zero_layer_steps
from train.measure.probe import barrier_seconds, measure, measure_groups
from train.runtime import launch_env
from train.runtime.ending import leave_when_the_task_ends


def pairs(levels: dict[str, list[list[int]]], sizes: list[int], collectives) -> list[dict]:
    """For each level whose groups hold more than 2 ranks, the same ranks in pairs (consecutive members of each
    group, every pair at once), so every level is timed on 2 ranks as well as on its full groups: the two sizes a
    latency per ring step is told from."""
    out = []
    for level, groups in levels.items():
        if len(groups[0]) > 2:
            two = [[g[i], g[i + 1]] for g in groups for i in range(0, len(g) - 1, 2)]
            out += [{"kinds": ["pairs"], "runs": [], "level": level, "collective": c, "groups": two, "sizes": sizes}
                    for c in collectives]
    return out


def on_ranks_here(specs: list[dict], hosts: list[str]) -> list[dict]:
    """The runs' groups (launcher.actions.probe.run_groups gives them as seats) as the ranks holding those seats
    here: the probe's ranks stand where the scheduler started them, and a run placed in the job is reordered before
    it trains while the probe is not, so the plan's rank numbers would time a run's FedAvg pairs across the trunk
    on pairs under one leaf. A group with a seat no rank holds here is left out."""
    rank_of = {seat: rank for rank, seat in enumerate(seats(hosts))}
    out = []
    for spec in specs:
        groups = [[rank_of.get(tuple(seat)) for seat in g] for g in spec["seats"]]
        if not any(None in g for g in groups):
            out.append({**{k: v for k, v in spec.items() if k != "seats"}, "groups": groups})
    return out


def run(ranks, work, out_path: str, level_groups, collectives) -> None:
    """`ranks`: where and how the ranks run (hosts, topology, device, backend, timeout_s); `work`: sizes, iters,
    workloads, layouts, budget_s, the runs' groups and 0-layer layouts; `level_groups(hosts, parent, level)`: the rank
    groups per level, computed here from where the ranks really are (every rank's SLURMD_NODENAME under SLURM, else the
    planned hosts)."""
    env = launch_env.detect()
    device = launch_env.pick_device(ranks.device)
    if device == "cpu":
        launch_env.limit_cpu_threads(env)
    machine = None  # which machine rank 0 runs on, before the probe loads it
    if env.rank == 0:
        import torch

        machine = describe_machine(f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}"
                                   if device == "cuda" else None)
    out_dir = Path(out_path).parent
    backend = launch_env.init(env, device, ranks.backend, out_dir, ranks.timeout_s)
    hosts = [None] * env.world_size
    dist.all_gather_object(hosts, os.environ.get("SLURMD_NODENAME", ranks.hosts[env.rank]))
    levels = level_groups(hosts, ranks.topology["parent"], ranks.topology["level"])
    say = lambda text: print(text, flush=True)  # noqa: E731
    budget_s = work.budget_s
    rows = measure(env.rank, levels, work.sizes, collectives, device, iters=work.iters, progress=say)
    groups = pairs(levels, work.sizes, collectives) + on_ranks_here(work.groups, hosts)
    scale = measure_groups(env.rank, groups, device, iters=work.iters, progress=say)
    barrier_s = barrier_seconds(device)
    host = {"collective_s": collective_seconds(collectives, device)}
    compute = calibrate(env.rank, work.workloads, device, iters=work.iters, budget_s=budget_s, progress=say)
    stages = calibrate_layouts(env.rank, work.layouts, device, iters=work.iters, budget_s=budget_s, progress=say)
    host["zero_layer_steps"] = zero_layer_steps(env.rank, work.zero_layer, device, work.iters,
                                                budget_s, say)
    launch_env.shutdown(env, out_dir)
    if env.rank == 0:
        write_atomic(Path(out_path), json.dumps({"backend": backend, "hosts": hosts, "levels": rows, "scale": scale,
                                                 "barrier_s": barrier_s, "host": host, "compute": compute,
                                                 "layouts": stages, "budget_s": budget_s,
                                                 "machine": machine}) + "\n")
    leave_when_the_task_ends()  # calibrate's fully_shard leaves gloo groups to finalization (train.runtime.ending)
