"""The train settings, one dataclass per concern (batches, optimizer, numerics, outer step, parallelism, checkpoints,
evaluation, timing), each field with its default, type, limit and one line of documentation: the only place they
are written. TrainConfig joins them under one flat namespace, since `train.K` is what users type and spec.json
carries; the launcher registers its defaults with Hydra's ConfigStore (conf/train/*.yaml hold overrides only), and
docs/config-keys.md is `python -m train.contract.config`'s output (with the data sections' keys,
train.contract.sections).

Torch-free: the launcher validates a sweep's settings with this code before anything is submitted.
"""
from __future__ import annotations

import dataclasses
import json
import re
import typing
from dataclasses import dataclass

from train.contract.common import SpecError
from train.contract.sections import (
    ABOVE_ZERO,
    COUNT,
    DATA_KINDS,
    POSITIVE,
    Limit,
    check_fields,
    describe,
    key,
    one_of,
    registered,
)

PRECISIONS = ("fp32", "bf16", "paper")
REDUCE_DTYPES = ("fp32", "bf16")  # what FSDP reduces gradients in (train.parallel.parallelize)
TIMINGS = ("phases",)  # device events at phase boundaries, no barrier (train.measure.metrics.PhaseClock)
INITS = ("auto", "full", "meta")
OUTERS = ("fedavg", "diloco")  # what a federated run does every A steps (train/federation: federated, outer)
WIRE_DTYPES = ("fp32", "bf16", "int8")  # train.aggregation_dtype (train.federation.compress)
ON_NONFINITE = ("stop", "skip_step")  # what a NaN or inf loss or gradient does (train.runtime.nonfinite)
PP_SCHEDULES = ("gpipe", "1f1b")  # train.pp_schedule (train.parallel.pipeline)
CHECKPOINTING = ("none", "full", "selective")  # train.activation_checkpointing (train.parallel.checkpointing)
FAULT_KINDS = ("kill", "slow")  # train.fault_kind (train.runtime.fault)
FAULT_TOLERANCES = ("none", "groups")  # train.fault_tolerance (train.federation.groups)
HEARTBEAT_MS = 2000  # a fault-tolerant group silent this long is dead to the Lighthouse (train.federation.lighthouse)
GROUP_RESTARTS = 3  # starts of a lost fault-tolerant group after its first (forked_ranks; launcher.actions.groups)


def not_restarted(starts: int, others_train: bool) -> str | None:
    """Why a lost fault-tolerant group is not started again, None when it is: it heals from a group that still trains,
    and a group lost this often is failing for a reason a restart does not mend."""
    if not others_train:
        return "no other group trains to heal from"
    return f"{GROUP_RESTARTS} restarts used" if starts >= GROUP_RESTARTS else None


@dataclass
class Batches:
    steps: int = key(20, "optimizer steps", POSITIVE)
    seq_len: int = key(128, "tokens per sequence", Limit("at least 2", lambda v: v >= 2))
    batch_per_rank: int = key(2, "sequences per GPU per step (the launcher gives a data-parallel rank of tp x pp "
                                 "GPUs tp x pp times as many, so layouts on the same GPUs train the same global "
                                 "batch)", POSITIVE)
    seed: int = key(42, "initialisation and data; repeats add 0, 1, 2...")


@dataclass
class Optimizer:
    lr: float = key(3e-4, "peak learning rate (AdamW)", ABOVE_ZERO)
    betas: tuple[float, float] = key((0.9, 0.95), "AdamW's betas",
                                     Limit("two numbers in [0, 1)", lambda v: all(0 <= b < 1 for b in v)))
    eps: float = key(1e-8, "AdamW's epsilon")
    weight_decay: float = key(0.1, "AdamW's decoupled weight decay")
    warmup_frac: float = key(0.1, "linear warm-up over this share of the steps, then cosine decay",
                             Limit("in [0, 1)", lambda v: 0 <= v < 1))
    min_lr_frac: float = key(0.0, "the cosine's floor, as a share of lr", Limit("in [0, 1]", lambda v: 0 <= v <= 1))
    max_norm: float = key(0.0, "clip the gradients' global norm (over the group's shards, replicas and stages) to "
                               "this before each optimizer step; 0: no clipping (torchtitan clips at 1.0)",
                          Limit("a number >= 0", lambda v: v >= 0))


@dataclass
class Numerics:
    precision: str = key("fp32", "fp32 | bf16 | paper (the authors' bf16 mixed precision, FedAvg summed in fp32)",
                         one_of(PRECISIONS))
    reduce_dtype: str = key("fp32", "fp32 | bf16: what FSDP reduces gradients in (and accumulates them in under "
                                    "pp), on every backend", one_of(REDUCE_DTYPES))
    on_nonfinite: str = key("stop", "a NaN or inf loss or gradient: stop the run before it is averaged or "
                                    "checkpointed (one line naming step, rank, group and tensor; not retried) | "
                                    "skip_step: every rank drops that step's update (counted in result.json's "
                                    "skipped_steps)", one_of(ON_NONFINITE))
    tf32: bool = key(True, "on CUDA, fp32 matmuls and convolutions run on TF32 tensor cores (10-bit mantissa "
                           "products, fp32 accumulation), as torchtitan and most GPU training do; false: full fp32 "
                           "(several times slower on A100/H100)")
    init: str = key("auto", "full: every rank builds the whole model from the seed, then keeps its shard | meta: "
                            "each rank materializes only its shard | auto: full up to a size limit, else meta",
                    one_of(INITS))


@dataclass
class OuterStep:
    """What FL strategies do every A steps; FSDP and HSDP, which never average, run at these defaults."""

    average_optimizer_state: bool = key(False, "FedAvg averages AdamW's moments too")
    final_average: bool = key(True, "FL strategies: one last FedAvg after the last step, so one model is evaluated")
    outer: str = key("fedavg", "fedavg averages the groups; diloco then takes a Nesterov outer step on the averaged "
                               "pseudo-gradient (train/federation/outer.py)", one_of(OUTERS))
    outer_lr: float = key(0.7, "DiLoCo's outer learning rate (fedavg = lr 1, momentum 0)",
                          Limit("a number > 0", lambda v: v > 0))
    outer_momentum: float = key(0.9, "DiLoCo's outer Nesterov momentum", Limit("in [0, 1)", lambda v: 0 <= v < 1))
    outer_offload: bool = key(False, "DiLoCo's synchronized copy and momentum in CPU memory")
    aggregation_dtype: str = key("fp32", "what crosses the federation links: fp32 (uncompressed: the parameters in "
                                         "their own dtype) | bf16 | int8 (pseudo-gradients, summed in fp32: "
                                         "train/federation/compress.py)", one_of(WIRE_DTYPES))
    outer_fragments: int = key(1, "streaming: fragments synced in rotation, one every A/N steps (N divides A)",
                               POSITIVE)
    outer_delay: int = key(0, "streaming: inner steps a fragment's exchange overlaps (< A/N)", COUNT)

    @property
    def streamed(self) -> bool:
        return self.outer_fragments > 1 or self.outer_delay > 0


@dataclass
class Degrees:
    """The model-parallel degrees as users type them (train.tp, train.pp): a run holds them in its Layout (P, T),
    never here, so the launcher takes them out of the train settings when it makes a run (train.contract.spec)."""

    tp: int = key(1, "tensor-parallel degree: ranks of one node splitting each block's matrices (transformers' "
                     "plan: q/k/v/gate/up column-wise, o/down row-wise, lm_head by vocabulary); divides the heads, "
                     "the KV heads and the node's GPUs (sweep.tp sweeps it)", POSITIVE)
    pp: int = key(1, "pipeline stages of consecutive layers (at most the layers; sweep.pp sweeps it)", POSITIVE)


@dataclass
class Parallelism:
    sequence_parallel: bool = key(False, "with tp > 1: norms and residuals on a slice of the sequence, all-gather + "
                                         "reduce-scatter instead of all-reduce (less activation memory); seq_len "
                                         "must divide by tp")
    microbatches: int = key(0, "per step and pipeline (0: one per stage); at least pp, and divides batch_per_rank",
                            Limit("an integer >= 0 (0: one per stage)", lambda v: v >= 0))
    pp_schedule: str = key("1f1b", "gpipe: every forward, then every backward | 1f1b: interleaved, fewer "
                                   "activations held", one_of(PP_SCHEDULES))
    activation_checkpointing: str = key("none", "none | full: each layer keeps only its input for backward and "
                                                "recomputes the rest | selective: torchtitan's op-level policy, each "
                                                "layer keeps its input, every other matmul's output and attention's, "
                                                "and recomputes the rest", one_of(CHECKPOINTING))


@dataclass
class Checkpoints:
    checkpoint_every: int = key(0, "steps between sharded checkpoints (0: none); a requeued or rerun job resumes",
                                COUNT)
    keep_checkpoints: int = key(2, "the newest checkpoints kept", Limit("an integer >= 1", lambda v: v >= 1))
    stop_check_every: int = key(5, "fewest steps between agreements on the scheduler's stop signal (USR2), each at "
                                   "a step that logs, averages or checkpoints: all ranks then checkpoint, submitit "
                                   "requeues", POSITIVE)
    elastic: bool = key(False, "a resume may change the layout (fewer federation groups, another R or S)")


@dataclass
class Evaluation:
    eval_batch: int = key(8, "sequences per evaluation batch", POSITIVE)
    eval_every: int = key(0, "steps between evaluations during training, timed apart (0: only the final one; FL "
                             "strategies: a multiple of A, so each follows a FedAvg)", COUNT)
    target_ppl: float | None = key(None, "eval perplexity whose first crossing gives time_to_target_s (null: none)",
                                   Limit("a perplexity > 1 or null", lambda v: v is None or v > 1))


@dataclass
class Timing:
    timing: str = key("phases", "phase boundaries as device events, read at log time: no barrier, no host sync",
                      one_of(TIMINGS))
    log_every: int = key(10, "steps between metric lines on stdout (metrics.jsonl has every step)", POSITIVE)
    timeout_s: float = key(600.0, "process-group timeout for collectives; with fault_tolerance=groups also how "
                            "long finished groups wait for a lost one before leaving it out", ABOVE_ZERO)
    watchdog_s: float = key(600.0, "a phase lasting longer fails the run, naming rank, phase and step", ABOVE_ZERO)
    profile: str = key("", "START:STOP: torch.profiler traces of steps START..STOP-1 (0-based), one per rank in "
                           "<run>/profile/ (Chrome/Perfetto); the profiled steps run slower")
    heartbeat_dir: str = key("", "\"\": heartbeats stay node-local (/dev/shm); a shared path: one file per node "
                                 "every 10 s there, so the watchdog names ranks on other nodes")


@dataclass
class Kernels:
    """How a step's work is executed on the device; none of it changes what is computed beyond rounding."""

    compile: bool = key(False, "torch.compile each decoder layer (inductor), as torchtitan does; the first steps' "
                               "compilation is timed apart (result.json's compile_s)")
    float8: bool = key(False, "the decoder layers' matmuls in float8 (torchao's float8 training, `pip install "
                              "fedshard[float8]`); only on GPUs with fp8 (compute capability 8.9+: H100, H200, B200)")
    float8_all_gather: bool = key(False, "with train.float8: FSDP gathers the decoder layers' weights in float8 "
                                         "(torchao's enable_fsdp_float8_all_gather, their scales computed once after "
                                         "each optimizer step), half of bf16's bytes")
    prefetch: bool = key(True, "FSDP2's implicit prefetch: each unit's all-gather issued one unit ahead, in forward "
                               "and backward, to overlap the compute before it; false: each all-gather only when its "
                               "unit is reached, every one exposed, as the paper's FSDP1 ran (forward_prefetch=False, "
                               "backward_prefetch=None). The same collectives and the same losses; only when they are "
                               "issued changes")


@dataclass
class Faults:
    """A fault injected on purpose (issue 56): the same fault at the same step on the same seeds is what lets
    layouts and recovery paths be compared on what a lost node costs them."""

    fault_step: int = key(0, "after this optimizer step (and its checkpoint, if one is due) of a run's first "
                             "attempt, the fault (train.fault_kind) strikes federation group fault_group; "
                             "<run>/fault.json records it (0: no fault)", COUNT)
    fault_group: int = key(0, "the federation group the fault strikes, 0 to F - 1 (FSDP and HSDP have one: the "
                              "whole run)", COUNT)
    fault_kind: str = key("kill", "kill: the group's ranks die (SIGKILL), their SLURM nodes set DOWN first, as a lost "
                                  "node's are | slow: from then on they run only train.fault_speed of each 100 ms "
                                  "(stopped and continued, as a CPU quota throttles them)", one_of(FAULT_KINDS))
    fault_speed: float = key(0.5, "fault_kind=slow: the share of the time the group's ranks still run",
                             Limit("in (0, 1)", lambda v: 0 < v < 1))


@dataclass
class FaultTolerance:
    """Federation groups as failure domains (issue 56): FL's groups train apart between averages, so a lost or late
    group need not stop the others."""

    fault_tolerance: str = key("none", "none: one lost rank ends the run | groups (FL+FSDP, FL+HSDP): each "
                                       "federation group its own world (a process tree on cluster=local, a SLURM job "
                                       "on a cluster), averaging through a torchft quorum; a lost group is started "
                                       "again and heals from a live peer (train/federation/groups.py)",
                               one_of(FAULT_TOLERANCES))
    quorum_min: int = key(1, "fault_tolerance=groups: the fewest groups an average goes on with (1 to F)", POSITIVE)
    grace_s: float = key(5.0, "fault_tolerance=groups: how long an average waits for a late group that is still "
                              "alive before going on without it (the late group then heals from its peers)",
                         ABOVE_ZERO)


# Bases in reverse: a dataclass lists its bases' fields from the last base to the first.
@dataclass
class TrainConfig(FaultTolerance, Faults, Timing, Evaluation, Checkpoints, Kernels, Parallelism, OuterStep, Numerics,
                  Optimizer, Batches):
    """Optimisation and measurement settings of one run; defaults are the paper authors' (AdamW 0.9/0.95, wd 0.1,
    10 % warm-up, cosine)."""

    def validate(self) -> None:
        check_fields(self, "train", SpecError)
        if self.float8_all_gather and not self.float8:
            raise SpecError("train.float8_all_gather=true gathers float8 weights, which only train.float8=true has: "
                            "set both, or neither")
        profile_window(self.profile, self.steps)
        if self.fault_step >= self.steps:
            raise SpecError(f"train.fault_step={self.fault_step} must be below train.steps={self.steps}: the fault "
                            f"comes after that step, and a run that has ended has nothing left to lose")
        if self.aggregation_dtype != "fp32" and self.average_optimizer_state:
            raise SpecError(f"train.aggregation_dtype={self.aggregation_dtype} compresses pseudo-gradients, which "
                            f"optimizer moments have none of: use it with train.average_optimizer_state=false")
        if self.streamed and self.average_optimizer_state:
            raise SpecError("train.outer_fragments/outer_delay stream pseudo-gradients, which optimizer moments have "
                            "none of: use them with train.average_optimizer_state=false")



@dataclass
class TrainKeys(TrainConfig, Degrees):
    """Every train.K key users type: a run's train settings (TrainConfig) and the degrees its Layout takes. The
    launcher registers these defaults with Hydra; docs/config-keys.md lists them."""


def keys_markdown() -> str:
    """docs/config-keys.md: every train key by concern and every data kind's keys, each with its type, default,
    limit and meaning."""
    lines = ["# Train and data keys", "", "Every `train.K` key, by concern, and every `data.K` key of each data kind: "
             "`python -m train.contract.config > docs/config-keys.md` (train/contract/config.py and "
             "train/contract/sections.py, the one place "
             "they are written; tests/test_docs.py checks this page). Set one on the command line (`train.lr=1e-3`, "
             "`data.branching=4`), in a sweep's `train:` block, or in a preset of conf/train/ or conf/data/; a key "
             "whose default is `???` must be set.", ""]
    sections = [(f"train: {c.__name__}", c) for c in reversed(TrainKeys.__mro__[2:-1])]
    sections += [(f"data={c.kind}", c) for c in DATA_KINDS.values()]
    for title, cls in sections:
        hints = typing.get_type_hints(cls)
        lines += [f"## {title}", "", "| key | type | default | limit | what it does |", "|---|---|---|---|---|"]
        defaults = registered(cls)
        for f in dataclasses.fields(cls):
            limit = f.metadata["limit"]
            cells = [f"`{f.name}`", describe(hints[f.name]), f"`{_yaml(defaults[f.name])}`",
                     limit.says if limit else "", f.metadata["doc"]]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _yaml(value) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return value or '""'
    return f"[{', '.join(map(str, value))}]" if isinstance(value, list) else repr(value)


def profile_window(text: str, steps: int) -> tuple[int, int] | None:
    """(START, STOP) of train.profile (train.measure.profiling), checked against the run's steps; None for ""
    (no profiling)."""
    if text == "":
        return None
    found = re.fullmatch(r"(\d+):(\d+)", text)
    if not found or not int(found.group(1)) < int(found.group(2)) <= steps:
        raise SpecError(f"train.profile must be START:STOP with 0 <= START < STOP <= train.steps ({steps}), e.g. "
                        f"2:4 for the third and fourth steps, or \"\" for none; got {text!r}")
    return int(found.group(1)), int(found.group(2))


if __name__ == "__main__":
    print(keys_markdown(), end="")
