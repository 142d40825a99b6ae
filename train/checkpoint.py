"""Sharded checkpoints for exact resume: model and optimizer through torch.distributed.checkpoint, plus
the LR schedule, step, FedAvg count and RNG state.

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


def _group_key(trainer) -> str:
    return f"fed{trainer.coord[0]}"


def _state(trainer) -> dict:
    """This rank's shards under its federation group's key.

    Every group's DTensors cover the same global tensors with the same offsets; without a
    per-group key DCP would keep one group's copy and hand it to all groups on load.
    """
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    return {_group_key(trainer): {"model": model_sd, "optim": optim_sd}}


def save(trainer, steps_done: int) -> Path:
    final = root(trainer.spec.out_dir) / f"{PREFIX}{steps_done:06d}"
    tmp = final.with_name(f".{final.name}.tmp")
    if trainer.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(trainer), checkpoint_id=str(tmp))
    torch.save({"rng": torch.get_rng_state()}, tmp / f"rank{trainer.rank}.pt")
    dist.barrier()
    if trainer.rank == 0:
        meta = {"step": steps_done, "aggregations": trainer.aggregations, "layout": layout(trainer.spec),
                "scheduler": trainer.schedule.state_dict()}
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
    state = _state(trainer)
    dcp.load(state, checkpoint_id=str(path))
    mine = state[_group_key(trainer)]
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=mine["model"], optim_state_dict=mine["optim"])
    trainer.schedule.load_state_dict(meta["scheduler"])
    torch.set_rng_state(torch.load(path / f"rank{trainer.rank}.pt")["rng"])
    return meta
