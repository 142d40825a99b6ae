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
from train.measure import profiling
from train.parallel.dims import Dims
from train.parallel.strategy import STRATEGIES, Layout
from train.sections import (
    DataSection,
    ModelSection,
    SyntheticData,
    check_types,
    data_section,
    data_to_dict,
    reject_unknown,
)

# FedAvg packs shards into flat buffers of at most this size, one collective each (train.federation.federated; the
# step-time model counts them without importing torch).
FEDAVG_CHUNK_BYTES = 256 * 2**20
INT8_BLOCK = 64  # values sharing one scale in an int8 exchange (train.federation.compress): 1 + 4/64 bytes per value
PRECISIONS = ("fp32", "bf16", "paper")
REDUCE_DTYPES = ("fp32", "bf16")  # what FSDP reduces gradients in (train.parallel.parallelize)
RETIRED_TRAIN_KEYS = ("compute_only_steps",)  # measured nothing the run did not do already (train.measure.exposed)
TIMINGS = ("phases",)  # device events at phase boundaries, no barrier (train.measure.metrics.PhaseClock)
INITS = ("auto", "full", "meta")
OUTERS = ("fedavg", "diloco")  # what a federated run does every A steps (train/federation: federated, outer)
WIRE_DTYPES = ("fp32", "bf16", "int8")  # train.aggregation_dtype (train.federation.compress); fp32: as parameters are
ON_NONFINITE = ("stop", "skip_step")  # what a NaN or inf loss or gradient does (train.runtime.nonfinite)
PP_SCHEDULES = ("gpipe", "1f1b")  # train.pp_schedule (train.parallel.pipeline)


@dataclass
class TrainConfig:
    """Optimisation and measurement settings; defaults are the paper authors' (AdamW 0.9/0.95, wd 0.1,
    10 % warm-up, cosine)."""

    steps: int = 20
    seq_len: int = 128
    batch_per_rank: int = 2
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_frac: float = 0.1
    min_lr_frac: float = 0.0
    seed: int = 42
    precision: str = "fp32"
    reduce_dtype: str = "fp32"  # what FSDP reduces (and, under pp, accumulates) gradients in, on every backend
    average_optimizer_state: bool = False
    final_average: bool = True
    timing: str = "phases"
    log_every: int = 10
    eval_batch: int = 8
    eval_every: int = 0  # steps between evaluations during training (0: only the final one); timed apart
    target_ppl: float | None = None  # eval perplexity whose first crossing gives time_to_target_s
    outer: str = "fedavg"  # fedavg: average the groups; diloco: Nesterov outer step on the averaged pseudo-gradient
    outer_lr: float = 0.7  # DiLoCo's outer learning rate and momentum (its paper's values)
    outer_momentum: float = 0.9
    outer_offload: bool = False  # keep DiLoCo's synchronized copy and momentum in CPU memory
    aggregation_dtype: str = "fp32"  # what crosses the federation links: fp32 (uncompressed), bf16 or int8
    outer_fragments: int = 1  # streaming: fragments synced in rotation, one every A / N steps (train.federation.outer)
    outer_delay: int = 0  # streaming: inner steps a fragment's exchange overlaps before it is merged
    on_nonfinite: str = "stop"  # a NaN/inf loss or gradient: stop (before it is averaged or saved) | skip_step
    init: str = "auto"
    timeout_s: float = 600.0
    watchdog_s: float = 600.0  # a phase lasting longer fails the run, naming rank, phase and step
    profile: str = ""  # START:STOP: torch.profiler traces of steps START..STOP-1, per rank (train.measure.profiling)
    heartbeat_dir: str = ""  # a shared directory where each node beats every 10 s, so the watchdog sees other nodes
    checkpoint_every: int = 0  # steps between sharded checkpoints (0: none); a rerun resumes from the latest
    keep_checkpoints: int = 2
    stop_check_every: int = 5  # fewest steps between agreements on the scheduler's stop signal, each at a step
                               # that logs, averages or checkpoints (train.runtime.preemption); then checkpoint, requeue
    elastic: bool = False  # a resume may change F (fewer federation groups), R or S: train.runtime.checkpoint
    tp: int = 1  # tensor-parallel degree: the ranks of a node that split each layer's matrices (train.parallel.tensor)
    sequence_parallel: bool = False  # with tp > 1: the norms run on a slice of the sequence (train.parallel.tensor)
    pp: int = 1  # pipeline stages: consecutive layers per stage (train.parallel.pipeline)
    microbatches: int = 0  # per step and pipeline (0: one per stage); the per-rank batch divides into them
    pp_schedule: str = "1f1b"  # gpipe: all forwards, then all backwards; 1f1b: interleaved, fewer activations held
    activation_checkpointing: bool = False  # keep each layer's input only; recompute the rest in backward

    @property
    def n_microbatches(self) -> int:
        return self.microbatches or self.pp

    @property
    def streamed(self) -> bool:
        return self.outer_fragments > 1 or self.outer_delay > 0

    def validate(self) -> None:
        check_types(self, "train", SpecError)
        positive = ("steps", "seq_len", "batch_per_rank", "log_every", "eval_batch", "stop_check_every",
                    "outer_fragments", "tp", "pp")
        for key in positive:
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise SpecError(f"train.{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.seq_len < 2:
            raise SpecError(f"train.seq_len must be at least 2, got {self.seq_len}")
        if not self.lr > 0:
            raise SpecError(f"train.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_frac < 1:
            raise SpecError(f"train.warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if not 0 <= self.min_lr_frac <= 1:
            raise SpecError(f"train.min_lr_frac must be in [0, 1], got {self.min_lr_frac}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise SpecError(f"train.betas must be two numbers in [0, 1), got {self.betas!r}")
        for key, allowed in (("precision", PRECISIONS), ("reduce_dtype", REDUCE_DTYPES), ("timing", TIMINGS),
                             ("init", INITS), ("outer", OUTERS),
                             ("aggregation_dtype", WIRE_DTYPES), ("on_nonfinite", ON_NONFINITE),
                             ("pp_schedule", PP_SCHEDULES)):
            if getattr(self, key) not in allowed:
                raise SpecError(f"train.{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise SpecError(f"train.checkpoint_every must be an integer >= 0, got {self.checkpoint_every!r}")
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 1:
            raise SpecError(f"train.keep_checkpoints must be an integer >= 1, got {self.keep_checkpoints!r}")
        if not isinstance(self.profile, str):
            raise SpecError(f"train.profile must be START:STOP or \"\", got {self.profile!r}")
        profiling.window(self.profile, self.steps)
        if not isinstance(self.heartbeat_dir, str):
            raise SpecError(f"train.heartbeat_dir must be a path (a string), got {self.heartbeat_dir!r}")
        if not self.watchdog_s > 0:
            raise SpecError(f"train.watchdog_s must be > 0, got {self.watchdog_s}")
        for key in ("elastic", "activation_checkpointing", "sequence_parallel"):
            if not isinstance(getattr(self, key), bool):
                raise SpecError(f"train.{key} must be true or false, got {getattr(self, key)!r}")
        if not self.timeout_s > 0:
            raise SpecError(f"train.timeout_s must be > 0, got {self.timeout_s}")
        if not isinstance(self.eval_every, int) or isinstance(self.eval_every, bool) or self.eval_every < 0:
            raise SpecError(f"train.eval_every must be an integer >= 0, got {self.eval_every!r}")
        if isinstance(self.outer_lr, bool) or not (isinstance(self.outer_lr, (int, float)) and self.outer_lr > 0):
            raise SpecError(f"train.outer_lr must be a number > 0, got {self.outer_lr!r}")
        if isinstance(self.outer_momentum, bool) or not (isinstance(self.outer_momentum, (int, float))
                                                         and 0 <= self.outer_momentum < 1):
            raise SpecError(f"train.outer_momentum must be in [0, 1), got {self.outer_momentum!r}")
        if not isinstance(self.outer_offload, bool):
            raise SpecError(f"train.outer_offload must be true or false, got {self.outer_offload!r}")
        if not isinstance(self.outer_delay, int) or isinstance(self.outer_delay, bool) or self.outer_delay < 0:
            raise SpecError(f"train.outer_delay must be an integer >= 0, got {self.outer_delay!r}")
        if self.aggregation_dtype != "fp32" and self.average_optimizer_state:
            raise SpecError(f"train.aggregation_dtype={self.aggregation_dtype} compresses pseudo-gradients, which "
                            f"optimizer moments have none of: use it with train.average_optimizer_state=false")
        if self.streamed and self.average_optimizer_state:
            raise SpecError("train.outer_fragments/outer_delay stream pseudo-gradients, which optimizer moments have "
                            "none of: use them with train.average_optimizer_state=false")
        if not isinstance(self.microbatches, int) or isinstance(self.microbatches, bool) or self.microbatches < 0:
            raise SpecError(f"train.microbatches must be an integer >= 0 (0: one per stage), got {self.microbatches!r}")
        if self.n_microbatches < self.pp:
            raise SpecError(f"train.microbatches={self.microbatches} is fewer than train.pp={self.pp} stages: the "
                            f"pipeline would never fill; use at least {self.pp}")
        if self.pp > 1 and self.batch_per_rank % self.n_microbatches:  # microbatches split only a pipeline's batch
            raise SpecError(f"the {self.batch_per_rank} sequences of a data-parallel rank (train.batch_per_rank; the "
                            f"launcher multiplies it by tp x pp) do not divide into {self.n_microbatches} "
                            f"microbatches (train.microbatches)")
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("train.sequence_parallel=true splits the sequence over the tensor-parallel group, but "
                            "train.tp=1: set train.tp > 1 or leave it false")
        if self.sequence_parallel and self.seq_len % self.tp:
            raise SpecError(f"train.sequence_parallel: train.seq_len={self.seq_len} does not split evenly over "
                            f"train.tp={self.tp} ranks")
        if self.target_ppl is not None and not (isinstance(self.target_ppl, (int, float)) and self.target_ppl > 1):
            raise SpecError(f"train.target_ppl must be a perplexity > 1 or null, got {self.target_ppl!r}")


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
            for f in dataclasses.fields(TrainConfig):
                if f.name.startswith("outer") or f.name == "aggregation_dtype":
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
    flat: dict = {f"train.{f.name}": list(f.default) if isinstance(f.default, tuple) else f.default
                  for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
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


