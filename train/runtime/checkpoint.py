"""Sharded checkpoints for exact resume: model, optimizer (and DiLoCo's outer state) through
torch.distributed.checkpoint, plus a `TrainState` (the LR schedule, step, FedAvg count and RNG state). A
`Checkpointer` owns them: which is the latest, when one is due, save, load and retention.

Storage does not grow with F where it need not: right after a FedAvg every federation group holds the
same parameters, so they are stored once (DCP keeps one copy of each shard). What really differs per
group is stored per group: AdamW's moments (unless `average_optimizer_state` averages them too) and each
rank's RNG. Periodic checkpoints are therefore taken at FedAvg steps: the one requested at step k is
taken at the first FedAvg at or after k (`Checkpointer.due`). Only a stop signal between two averagings, which cannot
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

from train.contract.common import SpecError
from train.contract.spec import ELASTIC, RunSpec, identity, identity_changes

PREFIX = "step-"


class TrainState:
    """What a checkpoint restores besides the model and optimizer shards: the optimizer steps done, the
    FedAvg rounds done, the LR schedule and this rank's RNG state. The Trainer advances it; the
    Checkpointer stores it (meta.json from rank 0, the RNG in each rank's own file)."""

    def __init__(self, schedule: torch.optim.lr_scheduler.LRScheduler):
        self.step = 0
        self.aggregations = 0
        self.tokens = 0  # tokens trained over every attempt (an elastic resume changes the world size)
        self.layout_changes: list[dict] = []  # elastic resumes: from, to, at_step, streams_dropped
        self.train_time_s = 0.0  # training time of the steps done, over every attempt (so a resumed run's
        self.schedule = schedule  # result covers the whole run)
        self.started_at: str | None = None  # the first attempt's start (UTC ISO 8601), kept across resumes
        self.skipped_steps = 0  # train.on_nonfinite=skip_step: updates dropped, over every attempt
        self.first_step_compile_s = 0.0  # train.compile: compilation inside the run's first step, whose time
                                         # holds it while train_time_s does not (Trainer.summary)

    def state_dict(self) -> dict:
        return {"step": self.step, "aggregations": self.aggregations, "train_time_s": self.train_time_s,
                "tokens": self.tokens, "layout_changes": self.layout_changes, "started_at": self.started_at,
                "skipped_steps": self.skipped_steps, "first_step_compile_s": self.first_step_compile_s,
                "scheduler": self.schedule.state_dict(),
                "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.aggregations = state["step"], state["aggregations"]
        self.train_time_s = state.get("train_time_s", 0.0)  # absent in checkpoints from before it was kept
        self.tokens = state.get("tokens", 0)
        self.layout_changes = list(state.get("layout_changes", []))
        self.started_at = state.get("started_at")
        self.skipped_steps = state.get("skipped_steps", 0)
        self.first_step_compile_s = state.get("first_step_compile_s", 0.0)
        self.schedule.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])


class Checkpointer:
    """One rank's side of the run's checkpoints in `<out_dir>/checkpoints`: which is the latest, when one is
    due, saving (keeping the newest `keep_checkpoints`) and loading. It is handed the objects it stores,
    never the Trainer, and needs from the spec only the layout, the schedule of checkpoints and FedAvg's."""

    def __init__(self, spec: RunSpec, rank: int, root: Path | None = None):
        """`root`: where a federation group that is its own world keeps its own (train.fault_tolerance=groups)."""
        self.root = root or Path(spec.out_dir) / "checkpoints"
        self.layout = {k: getattr(spec.layout, k) for k in ("strategy", "F", "R", "S", "A")}
        self.identity = identity(spec.to_dict())  # what the run's result depends on: a resume must match it
        self.every, self.keep = spec.train.checkpoint_every, spec.train.keep_checkpoints
        self.A = spec.layout.A  # None unless federated (RunSpec.validate)
        self.streamed = spec.federated and spec.train.streamed
        if self.streamed:  # a fragment launched every `period` steps lands `delay` steps later
            self.period, self.delay = spec.layout.A // spec.train.outer_fragments, spec.train.outer_delay
        self.average_optimizer_state = spec.train.average_optimizer_state
        self.rank = rank
        self.group = f"fed{spec.layout.coords(rank)[0]}"  # this rank's key for per-group parts
        # the optimizer's param_groups are not tensors, so DCP keeps one rank's copy: each stage needs its own
        self.stage = f"stage{spec.layout.coords(rank)[3]}" if spec.layout.P > 1 else None
        self.elastic, self.world = spec.train.elastic, spec.layout.dp_world  # one slice of each step's sequences each
        self.rank_step_tokens = spec.train.batch_per_rank * spec.train.seq_len

    def latest(self) -> Path | None:
        """The newest published checkpoint (unfinished `.tmp` writes are never returned)."""
        done = sorted(p for p in self.root.glob(f"{PREFIX}*") if (p / "meta.json").exists())
        return done[-1] if done else None

    def step_held_by_all(self, roots: list[Path]) -> Path | None:
        """This root's checkpoint of the newest step that every root in `roots` has published: where groups that
        checkpoint apart resume together once every one was lost (a group that was down at a later checkpoint
        lacks it). None: no step they all hold."""
        held = [{p.name for p in root.glob(f"{PREFIX}*") if (p / "meta.json").exists()} for root in roots]
        common = sorted(set.intersection(*held)) if held else []
        return self.root / common[-1] if common else None

    def due(self, steps_done: int, steps: int) -> bool:
        """Whether a periodic checkpoint is taken after `steps_done` of `steps` steps: every `every` steps, or
        in a federated run at the first FedAvg at or after each multiple of `every`; and after the last step,
        so that a restart during evaluation does not train the last steps again."""
        if not self.every:
            return False
        if steps_done == steps:
            return True
        if self.A is None:
            return steps_done % self.every == 0
        if self.streamed:  # the first step at or after each multiple of `every` with no exchange in flight
            previous = next(s for s in range(steps_done - 1, -1, -1) if self.quiet(s))
            return self.quiet(steps_done) and steps_done // self.every > previous // self.every
        return steps_done % self.A == 0 and steps_done // self.every > (steps_done - self.A) // self.every

    def quiet(self, steps_done: int) -> bool:
        """No streamed exchange in flight after `steps_done` steps: one launches after every multiple of
        `period` and lands `delay` steps later (whole syncs land within their step)."""
        return not self.streamed or steps_done == 0 or not self.delay or steps_done % self.period >= self.delay

    def per_group(self, steps_done: int) -> list[str]:
        """The parts that differ between federation groups after `steps_done` steps, so are stored per
        group: the optimizer unless FedAvg averages it too, the model unless FedAvg (which ends every A-th
        step, `FedAvg.due`) has just made it identical."""
        if self.A is None:
            return []
        if self.streamed:  # fragments are synced at different steps: the groups never hold the same model
            return ["model", "optim"]
        parts = [] if self.average_optimizer_state else ["optim"]
        return parts if steps_done % self.A == 0 else ["model", "optim"]

    def _layout_change(self, path: Path, meta: dict) -> dict | None:
        """The layout change an elastic resume makes (None: the same layout), or SpecError. Federation groups
        may only shrink: group f of the new layout continues group f's optimizer moments and rank k its rows
        of each step's sequences (the rows of ranks the new layout lacks are not trained from here on, which the
        result records); FSDP/HSDP may change R or S: DCP reshards parameters and moments."""
        old = meta["layout"]
        if old == self.layout:
            return None
        if not self.elastic:
            raise SpecError(f"checkpoint {path} was written with {old}, this run is {self.layout}; resuming with "
                            f"another layout needs train.elastic=true (or use a new out_dir)")
        if old["strategy"] != self.layout["strategy"] or old["A"] != self.layout["A"]:
            raise SpecError(f"checkpoint {path} was written by {old['strategy']} (A={old['A']}); an elastic resume "
                            f"keeps the strategy and A, this run is {self.layout['strategy']} (A={self.layout['A']})")
        if self.A is not None and self.layout["F"] > old["F"]:
            raise SpecError(f"checkpoint {path} has F={old['F']} federation groups; an elastic resume may shrink F, "
                            f"not grow it to {self.layout['F']}")
        before = meta.get("world", old["F"] * old["R"] * old["S"])
        return {"from": old, "to": self.layout, "at_step": meta["step"], "streams_dropped": max(0, before - self.world)}

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, fedavg=None) -> dict:
        """What `save` hands DCP after `step` steps (train.job.dryrun measures what building it holds)."""
        outer = fedavg.outer_state() if fedavg is not None else {}
        return self._state(model, optimizer, self.per_group(step), outer)

    def _state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, parts_per_group: list[str],
               outer: dict) -> dict:
        """This rank's shards, each part under a shared key or its federation group's key.

        Every group's DTensors cover the same global tensors with the same offsets: under a shared key DCP
        writes one copy (and hands it to every group on load), under `fed<f>` one copy per group. The outer
        optimizer's state (DiLoCo's synchronized copy and momentum) is the same in every group: shared.
        """
        model_sd, optim_sd = get_state_dict(model, optimizer)
        if self.stage is not None:
            optim_sd = {self.stage: optim_sd}
        state: dict = {"outer": outer} if outer else {}
        for part, sd in (("model", model_sd), ("optim", optim_sd)):
            if part in parts_per_group:
                state.setdefault(self.group, {})[part] = sd
            else:
                state[part] = sd
        return state

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
             fedavg=None) -> Path:
        """Checkpoint after `state.step` steps (collective: every rank calls it), then drop all but the
        newest `keep` checkpoints. `fedavg` (train.federation.federated or train.federation.outer) adds its outer
        state."""
        final = self.root / f"{PREFIX}{state.step:06d}"
        tmp = final.with_name(f".{final.name}.tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        parts_per_group = self.per_group(state.step)
        dcp.save(self.state_dict(model, optimizer, state.step, fedavg), checkpoint_id=str(tmp))
        train_state = state.state_dict()
        torch.save({"rng": train_state["rng"]}, tmp / f"rank{self.rank}.pt")
        dist.barrier()
        if self.rank == 0:
            meta = {"step": train_state["step"], "aggregations": train_state["aggregations"], "layout": self.layout,
                    "scheduler": train_state["scheduler"], "per_group": parts_per_group, "spec": self.identity,
                    "train_time_s": train_state["train_time_s"], "tokens": train_state["tokens"],
                    "layout_changes": train_state["layout_changes"], "world": self.world}
            (tmp / "meta.json").write_text(json.dumps(meta))
            os.replace(tmp, final)
            for old in sorted(p for p in self.root.glob(f"{PREFIX}*"))[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def load(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState,
             fedavg=None) -> None:
        """Restore everything `save` wrote; refuse a checkpoint written with another layout, or by a spec that
        differs in anything the result depends on (a changed `steps` would resume on the old LR schedule)."""
        meta = json.loads((path / "meta.json").read_text())
        moved = self._layout_change(path, meta)
        if "tokens" not in meta:  # written before tokens were counted: every step on the checkpoint's layout
            old = meta["layout"]
            meta["tokens"] = meta["step"] * old["F"] * old["R"] * old["S"] * self.rank_step_tokens
        changes = [c for c in identity_changes(meta.get("spec", self.identity), self.identity)
                   if not (moved and c.split(":")[0] in ELASTIC)]
        if changes:
            raise SpecError(f"checkpoint {path} was written by another spec ({', '.join(changes)}); resuming it would "
                            f"mix two experiments: use a new out_dir, or delete {self.root} to start afresh")
        outer = fedavg.outer_state() if fedavg is not None else {}
        shards = self._state(model, optimizer, meta["per_group"], outer)
        dcp.load(shards, checkpoint_id=str(path))
        mine = {**shards, **shards.get(self.group, {})}
        optim_sd = mine["optim"] if self.stage is None else mine["optim"][self.stage]
        set_state_dict(model, optimizer, model_state_dict=mine["model"], optim_state_dict=optim_sd)
        if outer:
            fedavg.load_outer_state(shards["outer"])
        rng = path / f"rank{self.rank}.pt"  # a rank the checkpoint's layout did not have keeps its seeded RNG
        state.load_state_dict({**meta, "rng": torch.load(rng)["rng"] if rng.exists() else torch.get_rng_state()})
        if moved:
            state.layout_changes.append(moved)
