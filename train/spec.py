"""The run spec: the only contract between the launcher and train/ (plain JSON, no Hydra).

A spec names a strategy, a grid F x R x S (federation groups x replicas x shards),
the aggregation period A, a model, a data source and the optimisation settings.
It is validated here, before any process group exists, so bad input fails fast
with one line on every rank.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from train.common import SpecError, write_atomic
from train.config import OuterStep, TrainConfig
from train.parallel.dims import Dims
from train.parallel.strategy import STRATEGIES, Layout
from train.sections import (
    DataSection,
    ModelSection,
    SyntheticData,
    data_section,
    data_to_dict,
    registered,
    reject_unknown,
)

# FedAvg packs shards into flat buffers of at most this size, one collective each (train.federation.federated; the
# step-time model counts them without importing torch).
FEDAVG_CHUNK_BYTES = 256 * 2**20
INT8_BLOCK = 64  # values sharing one scale in an int8 exchange (train.federation.compress): 1 + 4/64 bytes per value
RETIRED_TRAIN_KEYS = ("compute_only_steps",)  # measured nothing the run did not do already (train.measure.exposed)


@dataclass
class RunSpec:
    """One run. `A` is the FedAvg period in optimizer steps (None for FSDP/HSDP)."""

    strategy: str
    F: int
    R: int
    S: int
    out_dir: str
    A: int | None = None
    run_id: str = ""
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=SyntheticData)
    train: TrainConfig = field(default_factory=TrainConfig)
    device: str = "auto"
    backend: str = "auto"
    peak_flops: float | None = None
    axes: dict = field(default_factory=dict)  # keys a Hydra multirun swept (launcher -m) -> this run's value, as typed

    @property
    def dims(self) -> Dims:
        return Dims(self.F, self.R, self.S, self.train.pp, self.train.tp)

    @property
    def layout(self) -> Layout:
        return Layout(self.strategy, self.F, self.R, self.S, self.A, self.train.pp, self.train.tp)

    @property
    def world_size(self) -> int:
        return self.dims.world

    @property
    def federated(self) -> bool:
        return STRATEGIES[self.strategy].federated

    def validate(self) -> "RunSpec":
        if self.strategy not in STRATEGIES:
            raise SpecError(f"unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        for key in ("F", "R", "S"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{key} must be a positive integer, got {value!r}")
        why = STRATEGIES[self.strategy].accepts(self.F, self.R)
        if why:
            raise SpecError(f"{why}; got (F, R, S) = ({self.F}, {self.R}, {self.S})")
        self.train.validate()
        check_model_parallel(self.model.llama_kwargs, self.train.tp, self.train.pp)
        if self.federated:
            self.train.outer = STRATEGIES[self.strategy].exchange or self.train.outer
            if self.F < 2:
                raise SpecError(f"{self.strategy} needs F >= 2 federation groups, got F = {self.F}")
            if not isinstance(self.A, int) or isinstance(self.A, bool) or self.A < 1:
                raise SpecError(f"A (aggregation period in steps) must be an integer >= 1, got {self.A!r}")
            N, tau = self.train.outer_fragments, self.train.outer_delay
            if self.A % N:
                raise SpecError(f"train.outer_fragments={N} must divide A={self.A}: one fragment is synced every A/N "
                                f"steps, each every A steps")
            if tau >= self.A // N:
                raise SpecError(f"train.outer_delay={tau} must be < A/outer_fragments = {self.A // N} steps: a "
                                f"fragment's exchange must land before the next one is launched")
            if self.train.streamed and self.train.eval_every:
                raise SpecError(f"train.eval_every={self.train.eval_every} needs every group to hold the same model, "
                                f"which with train.outer_fragments={N} / outer_delay={tau} they never do between "
                                f"steps: use train.eval_every=0 (the final evaluation follows a full average)")
            if self.train.eval_every % self.A:
                raise SpecError(f"train.eval_every={self.train.eval_every} must be a multiple of A={self.A} for "
                                f"{self.strategy}: an evaluation then sees the federation's model, just averaged, "
                                f"not F different ones")
        else:  # FSDP/HSDP never average: a sweep-wide A, outer optimizer or wire dtype does not apply to them
            self.A = None
            for f in dataclasses.fields(OuterStep):
                if f.name not in ("average_optimizer_state", "final_average"):
                    setattr(self.train, f.name, f.default)
        if self.device not in ("auto", "cpu", "cuda"):
            raise SpecError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise SpecError(f"backend must be auto, gloo or nccl, got {self.backend!r}")
        if not self.out_dir:
            raise SpecError("out_dir must be set")
        if not (isinstance(self.axes, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in self.axes.items())):
            raise SpecError(f"axes must map swept keys to their values as strings, got {self.axes!r}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise SpecError(f"peak_flops must be > 0 or null, got {self.peak_flops!r}")
        if not self.run_id:
            self.run_id = default_run_id(self)
        return self

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "model": self.model.to_dict(), "data": data_to_dict(self.data)}

    @classmethod
    def from_dict(cls, raw: dict) -> "RunSpec":
        if not isinstance(raw, dict):
            raise SpecError("the spec must be a JSON object")
        raw = dict(raw)
        train = raw.pop("train", {}) or {}
        reject_unknown("spec", raw, _names(cls))
        for key in RETIRED_TRAIN_KEYS:  # stored spec.json files that still carry them load as they ran
            train.pop(key, None)
        reject_unknown("train", train, _names(TrainConfig))
        missing = [k for k in ("strategy", "F", "R", "S", "out_dir") if k not in raw]
        if missing:
            raise SpecError(f"spec is missing required key(s): {', '.join(missing)}")
        if isinstance(train.get("activation_checkpointing"), bool):  # how spec.json held it before 2026-12-05
            train["activation_checkpointing"] = "full" if train["activation_checkpointing"] else "none"
        if "betas" in train:
            train["betas"] = tuple(train["betas"])
        sections = {"model": ModelSection.from_dict(raw.pop("model", {"preset": "tiny"})),
                    "data": data_section(raw.pop("data", {"kind": "synthetic"}))}
        return cls(train=TrainConfig(**train), **sections, **raw).validate()

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunSpec":
        try:
            raw = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SpecError(f"spec file {path} does not exist") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"spec file {path} is not valid JSON: {exc}") from None
        return cls.from_dict(raw)

    def save(self, path: str | os.PathLike) -> None:
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")


# Spec keys that do not change what a run measures: where it writes, how long to wait for peers, how often to
# checkpoint. Every other key is part of the run's identity (train.loop refuses a checkpoint, and the launcher
# a run directory, made with a spec that differs in any of them).
NOT_IDENTITY = frozenset({"out_dir", "train.timeout_s", "train.watchdog_s", "train.heartbeat_dir", "train.profile",
                          "train.checkpoint_every", "train.keep_checkpoints", "train.stop_check_every",
                          "train.elastic"})
# What an elastic resume (train.elastic) may change: the layout, and the run id that names it.
ELASTIC = frozenset({"F", "R", "S", "run_id"})


def identity(spec: dict) -> dict:
    """A spec (as a dict) flattened to dotted keys, less NOT_IDENTITY: what the run's result depends on. A train
    key the spec lacks counts as its default, so a spec written before the key existed matches one that leaves
    it at the default (a run directory from an earlier version stays reusable)."""
    flat: dict = {f"train.{name}": default for name, default in registered(TrainConfig).items()}
    for key, value in spec.items():
        for inner_key, inner in (value.items() if isinstance(value, dict) else [(None, value)]):
            name = key if inner_key is None else f"{key}.{inner_key}"
            flat[name] = list(inner) if isinstance(inner, tuple) else inner  # as JSON reads it back
    return {k: v for k, v in flat.items() if k not in NOT_IDENTITY}


def identity_changes(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for each identity key on which two specs (as dicts) differ, sorted by key."""
    a, b = identity(old), identity(new)
    missing = object()
    return [f"{k}: {_show(a.get(k, missing))} -> {_show(b.get(k, missing))}"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


def _show(value) -> str:
    return "(unset)" if not isinstance(value, (str, int, float, bool, list, dict, type(None))) else repr(value)


def check_model_parallel(llama_kwargs: dict, tp: int, pp: int) -> None:
    """Refuse a tensor-parallel degree that does not split the heads, or more stages than layers (LlamaConfig's
    defaults where the model leaves a key out)."""
    heads = llama_kwargs.get("num_attention_heads", 32)
    kv_heads = llama_kwargs.get("num_key_value_heads") or heads
    layers = llama_kwargs.get("num_hidden_layers", 32)
    for what, n in (("attention heads", heads), ("KV heads", kv_heads)):
        if n % tp:
            raise SpecError(f"train.tp={tp} does not divide the model's {n} {what}: each tensor-parallel rank "
                            f"must hold whole heads")
    if layers < pp:
        raise SpecError(f"train.pp={pp} stages but the model has only {layers} layers")


def default_run_id(spec: RunSpec) -> str:
    """Stable, readable id such as fl_hsdp-F16-R8-S4-A8, or fsdp-F1-R1-S8-P2-T4 with pipeline / tensor parallelism."""
    run_id = f"{spec.strategy}-F{spec.F}-R{spec.R}-S{spec.S}"
    run_id += f"-A{spec.A}" if spec.A is not None else ""
    run_id += f"-P{spec.train.pp}" if spec.train.pp > 1 else ""
    return run_id + (f"-T{spec.train.tp}" if spec.train.tp > 1 else "")


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


