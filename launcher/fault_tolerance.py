"""Faults seen from the launcher: where fault-tolerant federation groups (train.fault_tolerance=groups) can run,
checked before anything is submitted (train/federation/groups.py has how they run), and what faults are expected to
cost each planned run (issue 56, item 6).

The price, first order in the fault rate (docs/training.md): with N nodes each failing every MTBF hours on average,
faults come at rate lambda = N / MTBF, and a run keeps the share goodput = 1 / (1 + lambda * c) of its fault-free
throughput, c being the whole-run seconds one fault costs:
- restart from the last checkpoint (FSDP, HSDP, FL without fault tolerance): every rank waits restart_s and trains
  again half a checkpoint interval on average: c = restart_s + (checkpoint_every or steps) / 2 * step_s;
- fault-tolerant groups (FL): one group of F waits restart_s (its job requeued), heals (its state, 12 bytes per
  parameter (fp32 parameters and AdamW's two moments), over its nodes' federation links) and loses half an
  averaging period on average, while the others wait one heartbeat before going on without it:
  c = (restart_s + heal_s + A / 2 * step_s) / F + heartbeat_s."""
from __future__ import annotations

import importlib.util

from launcher import scheduler as schedulers
from launcher.settings import Settings
from launcher.sweep import Run
from train.contract.common import ConfigError
from train.contract.config import HEARTBEAT_MS

STATE_BYTES_PER_PARAM = 12  # what a healing group receives: fp32 parameters and AdamW's two fp32 moments


def check(settings: Settings, runs: list[Run]) -> None:
    """Refuse, before anything is submitted, fault-tolerant groups where they cannot run: on cluster=local one job's
    supervisor restarts a lost group's process tree, on SLURM each group is a job of its own that SLURM places."""
    wanted = [run.run_id for run in runs if run.spec.train.fault_tolerance == "groups"]
    if wanted and settings.cluster.placement == "pinned" and not schedulers.of(settings.cluster).runs_here:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups submits a SLURM job per federation group, "
                          f"placed by SLURM (under one switch when a group spans nodes); cluster.placement=pinned "
                          f"orders one job's ranks with a hostfile: use cluster.placement=in_job")
    if wanted and importlib.util.find_spec("torchft") is None:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups needs torchft (pip install 'fedshard[ft]')")
    if wanted and settings.cluster.preflight:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups starts each group's ranks apart, which "
                          f"cluster.preflight's check of the whole job does not do yet: set cluster.preflight=false")


def goodput(nodes: int, mtbf_h: float, cost_s: float) -> float:
    """The share of its fault-free throughput a run on `nodes` keeps when each fault costs it `cost_s`."""
    return 1 / (1 + nodes / (mtbf_h * 3600) * cost_s)


def restart_cost_s(step_s: float, interval: int, restart_s: float) -> float:
    """A fault's cost to a run that restarts from its last checkpoint, `interval` steps apart."""
    return restart_s + interval / 2 * step_s


def rejoin_cost_s(step_s: float, A: int, F: int, heal_s: float, restart_s: float) -> float:
    """A fault's cost to fault-tolerant groups, in whole-run seconds: one group's loss, the others' heartbeat."""
    return (restart_s + heal_s + A / 2 * step_s) / F + HEARTBEAT_MS / 1000


def priced(entries, runs: list[Run], cluster) -> list[str]:
    """The plan's lines on faults: each run's expected goodput at cluster.node_mtbf_h, restarting from its
    checkpoint and, for FL runs, as fault-tolerant groups; none when the MTBF is not set."""
    mtbf = cluster.node_mtbf_h
    if mtbf is None:
        return []
    out = [f"expected goodput with each node failing every {mtbf:g} h on average (cluster.node_mtbf_h; restart "
           f"{cluster.restart_s:g} s, cluster.restart_s; launcher/fault_tolerance.py):"]
    specs = {run.run_id: run.spec for run in runs}
    for e in entries:
        nodes, step, L, t = len(e.nodes), e.predicted_step_s, e.layout, specs[e.run_id].train
        interval = t.checkpoint_every or t.steps
        since = f"every {interval} steps" if t.checkpoint_every else f"none: the start, {interval} steps"
        restart = goodput(nodes, mtbf, restart_cost_s(step, interval, cluster.restart_s))
        text = (f"  {e.run_id}: a fault every {mtbf / nodes:.3g} h; restart from the last checkpoint ({since}) "
                f"{restart:.3%}")
        if L.A is not None:
            group_nodes = max(1.0, nodes / L.F)  # a group's state arrives over its own nodes' links at once
            link = e.bandwidth["B_F"]
            heal = e.model_params * STATE_BYTES_PER_PARAM / group_nodes / link if link else 0.0
            cost = rejoin_cost_s(step, L.A, L.F, heal, cluster.restart_s)
            text += (f"; fault-tolerant groups {goodput(nodes, mtbf, cost):.3%} "
                     + (f"(heal {heal:.3g} s)" if link else "(heal not priced: no federation bandwidth)"))
        out.append(text)
    return out
