"""The run spec: what the launcher hands a job (plain JSON, no Hydra).

A spec names a Layout (strategy, grid F x R x S of federation groups x replicas x shards, aggregation period A,
pipeline stages P and tensor-parallel degree T), a model, a data source, the optimisation settings and which
repeat of its configuration it is.
It is validated here, before any process group exists, so bad input fails fast
with one line on every rank.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from train.contract.common import SpecError, write_atomic
from train.contract.config import OuterStep, TrainConfig, TrainKeys
from train.contract.layout import STRATEGIES, Layout
from train.contract.sections import (
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
LAYOUT_KEYS = ("strategy", "F", "R", "S", "A")  # spec.json's top-level keys for its Layout (P, T: train.pp, tp)
RETIRED_TRAIN_KEYS = ("compute_only_steps",)  # measured nothing the run did not do already (train.measure.exposed)


RANK_ORDERS = ("topology", "slurm")  # who orders the ranks: fedshard's placement, or SLURM's own order


@dataclass
class RunSpec:
    """One run: its Layout (strategy, F x R x S, A, P, T), what it trains, and which repeat of its configuration it
    is. spec.json keeps the shape it always had: strategy, F, R, S and A at the top, P and T as train.pp and
    train.tp (the keys users type)."""

    layout: Layout
    out_dir: str
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=SyntheticData)
    train: TrainConfig = field(default_factory=TrainConfig)
    device: str = "auto"
    backend: str = "auto"
    peak_flops: float | None = None
    axes: dict = field(default_factory=dict)  # keys a Hydra multirun swept (launcher -m) -> this run's value, as typed
    repeat: int = 1  # which repeat of its configuration (seed = train.seed of the sweep + repeat - 1)
    rank_order: str = "topology"  # RANK_ORDERS: who ordered the ranks (cluster.placement=slurm: SLURM)
    config: str = ""  # the configuration's name, from its layout and multirun point (config_name); kept when an
                      # elastic resume changes the layout, so the run keeps its directory and its row

    @property
    def run_id(self) -> str:
        """The run's directory and key: its configuration's name, and -repK for repeats after the first."""
        return self.config + (f"-rep{self.repeat}" if self.repeat > 1 else "")

    @property
    def world_size(self) -> int:
        return self.layout.world

    @property
    def federated(self) -> bool:
        return self.layout.federated

    @property
    def microbatches(self) -> int:
        """Microbatches per step and pipeline (train.microbatches, 0: one per stage)."""
        return self.train.microbatches or self.layout.P

    def validate(self) -> "RunSpec":
        layout, t = self.layout, self.train
        t.validate()
        check_model_parallel(self.model.llama_kwargs, layout.T, layout.P)
        self._check_pipeline()
        if self.federated:
            t.outer = layout.row.exchange or t.outer
            A, N, tau = layout.A, t.outer_fragments, t.outer_delay
            if A % N:
                raise SpecError(f"train.outer_fragments={N} must divide A={A}: one fragment is synced every A/N "
                                f"steps, each every A steps")
            if tau >= A // N:
                raise SpecError(f"train.outer_delay={tau} must be < A/outer_fragments = {A // N} steps: a "
                                f"fragment's exchange must land before the next one is launched")
            if t.streamed and t.eval_every:
                raise SpecError(f"train.eval_every={t.eval_every} needs every group to hold the same model, "
                                f"which with train.outer_fragments={N} / outer_delay={tau} they never do between "
                                f"steps: use train.eval_every=0 (the final evaluation follows a full average)")
            if t.eval_every % A:
                raise SpecError(f"train.eval_every={t.eval_every} must be a multiple of A={A} for "
                                f"{layout.strategy}: an evaluation then sees the federation's model, just averaged, "
                                f"not F different ones")
        else:  # FSDP/HSDP never average: a sweep-wide outer optimizer or wire dtype does not apply to them
            for f in dataclasses.fields(OuterStep):
                if f.name not in ("average_optimizer_state", "final_average"):
                    setattr(t, f.name, f.default)
        if t.fault_tolerance == "groups":
            self._check_groups()
        if t.fault_step and not t.fault_group < layout.F:
            raise SpecError(f"train.fault_group={t.fault_group} names no federation group of {layout.name}: "
                            f"its groups are 0 to {layout.F - 1}")
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
        if not isinstance(self.repeat, int) or isinstance(self.repeat, bool) or self.repeat < 1:
            raise SpecError(f"repeat must be a positive integer, got {self.repeat!r}")
        if self.rank_order not in RANK_ORDERS:
            raise SpecError(f"rank_order must be one of {', '.join(RANK_ORDERS)}, got {self.rank_order!r}")
        self.config = self.config or config_name(layout, self.axes)
        return self

    def _check_groups(self) -> None:
        """What train.fault_tolerance=groups needs: federation groups to fail over between, a quorum they can form,
        and the parts built for it so far (FedAvg or DiLoCo, compressed or not, whole, the same layout on a
        resume)."""
        layout, t = self.layout, self.train
        if not self.federated:
            raise SpecError(f"train.fault_tolerance=groups makes each federation group a failure domain, but "
                            f"{layout.strategy} has one group that is the whole run: use fl_fsdp or fl_hsdp")
        if t.quorum_min > layout.F:
            raise SpecError(f"train.quorum_min={t.quorum_min} is above F={layout.F}: no average could ever gather "
                            f"that many federation groups")
        unbuilt = [f"train.{k}={getattr(t, k)}" for k, v in (("outer_fragments", 1), ("outer_delay", 0),
                                                               ("elastic", False))
                   if getattr(t, k) != v]
        if unbuilt:
            raise SpecError(f"train.fault_tolerance=groups is built for FedAvg or DiLoCo of the whole model at each "
                            f"average; not yet with {', '.join(unbuilt)}")

    def _check_pipeline(self) -> None:
        """What the degrees ask of the train settings: microbatches that fill the pipeline and split its batch, a
        sequence that splits over the tensor-parallel group."""
        t, P, T, m = self.train, self.layout.P, self.layout.T, self.microbatches
        if m < P:
            raise SpecError(f"train.microbatches={t.microbatches} is fewer than train.pp={P} stages: the "
                            f"pipeline would never fill; use at least {P}")
        if P > 1 and t.batch_per_rank % m:  # microbatches split only a pipeline's batch
            raise SpecError(f"the {t.batch_per_rank} sequences of a data-parallel rank (train.batch_per_rank; the "
                            f"launcher multiplies it by tp x pp) do not divide into {m} microbatches "
                            f"(train.microbatches)")
        if t.sequence_parallel and T == 1:
            raise SpecError("train.sequence_parallel=true splits the sequence over the tensor-parallel group, but "
                            "train.tp=1: set train.tp > 1 or leave it false")
        if t.sequence_parallel and t.seq_len % T:
            raise SpecError(f"train.sequence_parallel: train.seq_len={t.seq_len} does not split evenly over "
                            f"train.tp={T} ranks")

    def to_dict(self) -> dict:
        L = self.layout
        raw = {k: v for k, v in dataclasses.asdict(self).items() if k != "layout"}
        return {"strategy": L.strategy, "F": L.F, "R": L.R, "S": L.S, "A": L.A, "run_id": self.run_id, **raw,
                "model": self.model.to_dict(), "data": data_to_dict(self.data),
                "train": {**raw["train"], "tp": L.T, "pp": L.P}}

    @classmethod
    def from_dict(cls, raw: dict) -> "RunSpec":
        if not isinstance(raw, dict):
            raise SpecError("the spec must be a JSON object")
        raw = dict(raw)
        train = dict(raw.pop("train", {}) or {})
        reject_unknown("spec", raw, [*LAYOUT_KEYS, "run_id", *(n for n in _names(cls) if n != "layout")])
        for key in RETIRED_TRAIN_KEYS:  # stored spec.json files that still carry them load as they ran
            train.pop(key, None)
        reject_unknown("train", train, _names(TrainKeys))
        missing = [k for k in ("strategy", "F", "R", "S", "out_dir") if k not in raw]
        if missing:
            raise SpecError(f"spec is missing required key(s): {', '.join(missing)}")
        if isinstance(train.get("activation_checkpointing"), bool):  # how spec.json held it before 2026-12-05
            train["activation_checkpointing"] = "full" if train["activation_checkpointing"] else "none"
        if "betas" in train:
            train["betas"] = tuple(train["betas"])
        strategy, F, R, S, A = (raw.pop(k, None) for k in LAYOUT_KEYS)
        if strategy in STRATEGIES and not STRATEGIES[strategy].federated:
            A = None  # FSDP/HSDP never average: a sweep-wide A does not apply to them
        layout = Layout(strategy, F, R, S, A, train.pop("pp", 1), train.pop("tp", 1))
        stored_id = raw.pop("run_id", None)
        if stored_id and "config" not in raw:  # spec.json before 2026-12-06 named the run only by its id
            raw["config"], raw["repeat"] = legacy_repeat(stored_id)
        sections = {"model": ModelSection.from_dict(raw.pop("model", {"preset": "tiny"})),
                    "data": data_section(raw.pop("data", {"kind": "synthetic"}))}
        return cls(layout, train=TrainConfig(**train), **sections, **raw).validate()

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
# checkpoint, which fault to inject (its cost is result.json's `fault`, apart from the steps' times). Every other
# key is part of the run's identity (train.loop refuses a checkpoint, and the launcher a run directory, made with a
# spec that differs in any of them).
NOT_IDENTITY = frozenset({"out_dir", "train.timeout_s", "train.watchdog_s", "train.heartbeat_dir", "train.profile",
                          "train.checkpoint_every", "train.keep_checkpoints", "train.stop_check_every",
                          "train.elastic", "train.fault_step", "train.fault_group", "train.fault_kind",
                          "train.fault_speed"})
# What an elastic resume (train.elastic) may change: the data-parallel grid (the run keeps its id; checkpoints
# before 2026-12-06 stored no config and renamed nothing either).
ELASTIC = frozenset({"F", "R", "S"})
# Identity keys a spec written before they existed lacks, at the value such a spec meant.
IDENTITY_DEFAULTS = {"repeat": 1, "rank_order": "topology"}


def identity(spec: dict) -> dict:
    """A spec (as a dict) flattened to dotted keys, less NOT_IDENTITY: what the run's result depends on. A train
    key the spec lacks counts as its default, so a spec written before the key existed matches one that leaves
    it at the default (a run directory from an earlier version stays reusable)."""
    flat: dict = {**IDENTITY_DEFAULTS, **{f"train.{name}": default for name, default in registered(TrainKeys).items()}}
    for key, value in spec.items():
        for inner_key, inner in (value.items() if isinstance(value, dict) else [(None, value)]):
            name = key if inner_key is None else f"{key}.{inner_key}"
            flat[name] = list(inner) if isinstance(inner, tuple) else inner  # as JSON reads it back
    return {k: v for k, v in flat.items() if k not in NOT_IDENTITY and k != "config"}  # run_id names it


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


def config_name(layout: Layout, axes: dict[str, str]) -> str:
    """A configuration's name: its layout's (fl_hsdp-F16-R8-S4-A8) and, for a multirun point, each swept key's last
    name and value in the order typed (-lr0.001-modeltiny; characters a directory name would trip on become _)."""
    return layout.name + "".join(f"-{key.rsplit('.', 1)[-1]}{re.sub(r'[^A-Za-z0-9.+_]', '_', value)}"
                                 for key, value in axes.items())


def legacy_repeat(run_id: str) -> tuple[str, int]:
    """(configuration, repeat) of a run id written before runs carried them as fields (2026-12-06): -repK ends the
    id of repeat K (a sweep's first repeat may end in -rep1). Read only for such files; nothing new is parsed."""
    found = re.search(r"-rep(\d+)$", run_id)
    return (run_id[:found.start()], int(found.group(1))) if found else (run_id, 1)


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


