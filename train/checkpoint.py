"""Sharded checkpoints for exact resume: model and optimizer through torch.distributed.checkpoint, plus
the LR schedule, step, FedAvg count and RNG state.

Storage does not grow with F where it need not: right after a FedAvg every federation group holds the
same parameters, so they are stored once (DCP keeps one copy of each shard). What really differs per
group is stored per group: AdamW's moments (unless `average_optimizer_state` averages them too) and each
rank's RNG. Periodic checkpoints are therefore taken at FedAvg steps: the one requested at step k is
taken at the first FedAvg at or after k (`due`). Only a stop signal between two averagings, which cannot
wait, stores the parameters per group as well (meta.json says which). Sizes:
`launcher.placement.costmodel.checkpoint_bytes`.

A checkpoint is written into `.step-NNNNNN.tmp/` and published by renaming it to `step-NNNNNN/`
after every rank has written and rank 0 has added meta.json, so a crash while saving leaves
the previous checkpoint as the latest. Data needs no state: batches are pure functions of
(seed, rank, step).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .errors import SpecError

PREFIX = "step-"


def root(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest(out_dir: Path) -> Path | None:
    """The newest published checkpoint (unfinished `.tmp` writes are never returned)."""
    done = sorted(p for p in root(out_dir).glob(f"{PREFIX}*") if (p / "meta.json").exists())
    return done[-1] if done else None


def layout(spec) -> dict:
    return {"strategy": spec.strategy, "F": spec.F, "R": spec.R, "S": spec.S, "A": spec.A}


def due(steps_done: int, every: int, A: int | None) -> bool:
    """Whether a periodic checkpoint is taken after `steps_done` steps: every `every` steps, or in a
    federated run at the first FedAvg at or after each multiple of `every`."""
    if not every:
        return False
    if A is None:
        return steps_done % every == 0
    return steps_done % A == 0 and steps_done // every > (steps_done - A) // every


def per_group(trainer, steps_done: int) -> list[str]:
    """The parts that differ between federation groups after `steps_done` steps, so are stored per group."""
    if trainer.fedavg is None:
        return []
    parts = [] if trainer.fedavg.average_optimizer_state else ["optim"]
    return parts if trainer.fedavg.due(steps_done) else ["model", "optim"]


def _state(trainer, parts_per_group: list[str]) -> dict:
    """This rank's shards, each part under a shared key or its federation group's key.

    Every group's DTensors cover the same global tensors with the same offsets: under a shared key DCP
    writes one copy (and hands it to every group on load), under `fed<f>` one copy per group.
    """
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state: dict = {}
    group = f"fed{trainer.coord[0]}"
    for part, sd in (("model", model_sd), ("optim", optim_sd)):
        if part in parts_per_group:
            state.setdefault(group, {})[part] = sd
        else:
            state[part] = sd
    return state


def _unpack(state: dict, group: str) -> tuple[dict, dict]:
    mine = {**state, **state.get(group, {})}
    return mine["model"], mine["optim"]


def save(trainer, steps_done: int) -> Path:
    final = root(trainer.spec.out_dir) / f"{PREFIX}{steps_done:06d}"
    tmp = final.with_name(f".{final.name}.tmp")
    if trainer.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    parts_per_group = per_group(trainer, steps_done)
    dcp.save(_state(trainer, parts_per_group), checkpoint_id=str(tmp))
    torch.save({"rng": torch.get_rng_state()}, tmp / f"rank{trainer.rank}.pt")
    dist.barrier()
    if trainer.rank == 0:
        meta = {"step": steps_done, "aggregations": trainer.aggregations, "layout": layout(trainer.spec),
                "scheduler": trainer.schedule.state_dict(), "per_group": parts_per_group}
        (tmp / "meta.json").write_text(json.dumps(meta))
        os.replace(tmp, final)
        for old in sorted(p for p in root(trainer.spec.out_dir).glob(f"{PREFIX}*"))[:-trainer.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(trainer, path: Path) -> dict:
    """Restore everything `save` wrote; refuse a checkpoint written with another layout."""
    meta = json.loads((path / "meta.json").read_text())
    if meta["layout"] != layout(trainer.spec):
        raise SpecError(f"checkpoint {path} was written with {meta['layout']}, this run is {layout(trainer.spec)}; "
                        f"resuming with another layout is refused (resharding is not supported: use a new out_dir)")
    state = _state(trainer, meta["per_group"])
    dcp.load(state, checkpoint_id=str(path))
    model_sd, optim_sd = _unpack(state, f"fed{trainer.coord[0]}")
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    trainer.schedule.load_state_dict(meta["scheduler"])
    torch.set_rng_state(torch.load(path / f"rank{trainer.rank}.pt")["rng"])
    return meta
