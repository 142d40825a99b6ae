"""result.json as a type: what one finished run measured, written by rank 0 and read by every report.

Torch-free, so the launcher, the reports and the tests read results with the same code the trainer writes
them with. `RunResult.from_dict` refuses unknown and missing keys, naming them; docs/result-schema.md is
generated from the field docs below (`python -m train.contract.result`) and a test keeps it in step.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from train.contract.common import FedshardError, write_atomic
from train.contract.sections import reject_unknown
from train.contract.spec import legacy_repeat


class ResultError(FedshardError):
    """A result.json that cannot be read as a RunResult."""


class StepTimes(NamedTuple):
    """One step's phase times in seconds on one rank; `step` is their sum."""
    forward: float
    backward: float
    optimizer: float
    aggregation: float

    @property
    def step(self) -> float:
        return self.forward + self.backward + self.optimizer + self.aggregation


PHASES = StepTimes._fields


def _doc(text: str, **kw):
    return field(metadata={"doc": text}, **kw)


@dataclass(frozen=True)
class Stats:
    """Mean and population standard deviation of `n` samples (mean and std are null when n = 0)."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: list[float]) -> "Stats":
        if not values:
            return cls(None, None, 0)
        mean = sum(values) / len(values)
        return cls(mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)), len(values))

    @classmethod
    def pool(cls, stats: list["Stats"]) -> "Stats":
        """Exact mean and std over the union of the samples, from each part's (mean, std, n)."""
        stats = [s for s in stats if s.n and s.mean is not None]
        n = sum(s.n for s in stats)
        if not n:
            return cls(None, None, 0)
        mean = sum(s.n * s.mean for s in stats) / n
        square = sum(s.n * (s.std ** 2 + s.mean ** 2) for s in stats) / n
        return cls(mean, math.sqrt(max(0.0, square - mean ** 2)), n)


@dataclass(frozen=True)
class RankRecord:
    """Where one rank ran."""

    rank: int
    host: str
    node: str | None = None  # SLURMD_NODENAME when SLURM started the rank, else the host name
    topology_addr: str | None = None  # SLURM_TOPOLOGY_ADDR (switch path or block.node)

    @property
    def where(self) -> str:
        return self.node or self.host


@dataclass(frozen=True)
class RunResult:
    """One run's measurements. Times exclude checkpoints and logging, which are timed apart."""

    run_id: str = _doc("the spec's run id: its config, and -repK for repeat K > 1 (fl_hsdp-F2-R2-S2-A8-rep2)")
    strategy: str = _doc("fsdp, hsdp, fl_fsdp or fl_hsdp")
    F: int = _doc("federation groups")
    R: int = _doc("replicas per federation group")
    S: int = _doc("shards per replica")
    A: int | None = _doc("FedAvg period in optimizer steps (null for FSDP/HSDP)")
    world_size: int = _doc("ranks: F x R x S x pp x tp")
    steps: int = _doc("optimizer steps of the whole run")
    seq_len: int = _doc("tokens per sequence")
    batch_per_rank: int = _doc("sequences per rank per step")
    tokens: int = _doc("tokens trained over the whole run (every attempt)")
    train_time_s: float = _doc("training wall time of the whole run, every attempt's summed; checkpoints and "
                               "logging excluded")
    tokens_per_s: float = _doc("tokens / train_time_s, the first step left out when others followed it "
                               "(first_step_s)")
    tokens_per_s_per_device: float = _doc("tokens_per_s / world_size")
    train_ppl: float = _doc("exp of the mean training loss over the last min(log_every, steps) steps")
    eval_ppl: float = _doc("perplexity on the held-out set after training (after the final FedAvg)")
    eval_time_s: float = _doc("time of that evaluation")
    floor_ppl: float | None = _doc("the data's best reachable perplexity (synthetic data), else null")
    phases: dict[str, Stats] = _doc("per phase (forward, backward, optimizer, aggregation): max over ranks "
                                    "per step, then mean/std over all steps but the first")
    aggregation_event: Stats = _doc("the aggregation phase over the steps that ran a FedAvg only")
    aggregations: int = _doc("FedAvg events, the final average included")
    timing: str = _doc("phases: each boundary an event on the device, read at log time; no barrier (results "
                       "before 2026-12 timed with a barrier at each boundary)")
    precision: str = _doc("fp32, bf16 or paper")
    params: int = _doc("model parameters")
    peak_memory_bytes: int = _doc("max over ranks: GPU peak allocation, or CPU peak resident set")
    mfu: float | None = _doc("model FLOPs utilisation, when the cluster states peak_flops")
    device: str = _doc("cpu or cuda")
    backend: str = _doc("gloo or nccl")
    data: dict = _doc("the data source's summary (kind, vocab, floor, files...)")
    ranks: list[RankRecord] = _doc("where each rank ran: rank, host, node, topology_addr")
    reduce_dtype: str | None = _doc("what FSDP reduced gradients in (train.reduce_dtype: fp32 or bf16); null in "
                                    "results before 2026-12, which reduced in fp32 with precision fp32 or bf16 and in "
                                    "bf16 with paper", default=None)
    resumed_from_step: int = _doc("the checkpoint step the last attempt resumed from (0: from scratch)", default=0)
    checkpoint_s: float = _doc("time the last attempt spent saving and loading checkpoints (not in train_time_s)",
                               default=0.0)
    checkpoints: int = _doc("checkpoints saved by the last attempt", default=0)
    logging_s: float = _doc("time the last attempt spent flushing metrics (not in train_time_s)", default=0.0)
    compile_s: float = _doc("time the last attempt spent compiling (train.compile; not in train_time_s, in the "
                            "first step's phase times)", default=0.0)
    eval_history: list[list] = _doc("[step, train_time_s, eval_ppl] of every evaluation (train.eval_every, then "
                                    "the final one); train_time_s is training time, evaluations excluded",
                                    default_factory=list)
    eval_s: float = _doc("time the last attempt spent in evaluations during training (not in train_time_s)",
                         default=0.0)
    target_ppl: float | None = _doc("train.target_ppl, when set", default=None)
    time_to_target_s: float | None = _doc("training time of the first evaluation at or below target_ppl; null "
                                          "when none reached it (or no target)", default=None)
    steps_to_target: int | None = _doc("the step of that evaluation, or null", default=None)
    aggregation_bytes: int = _doc("bytes one rank sent over the federation links in the last FedAvg event, a "
                                  "sync of the whole model (a streamed run's is its final average; the exchanging "
                                  "ranks' max; train.aggregation_dtype sets their type)", default=0)
    layout_changes: list[dict] = _doc("elastic resumes (train.elastic): from and to layout, the step, and how many "
                                      "data streams were no longer trained from there on", default_factory=list)
    fault: dict | None = _doc("the fault injected into this run (train.fault_step): its kind, step, federation group "
                              "and time (UTC), a slow one's speed; after a kill, the step the next attempt resumed "
                              "from, the steps and tokens trained again and the seconds from the fault to that "
                              "resume; with train.fault_tolerance=groups instead the step its group healed at, "
                              "the seconds from the fault to that heal, the tokens lost and left_out (the group did "
                              "not come back) (null: none struck)", default=None)
    aggregation_exchange_s: float = _doc("seconds the last attempt spent exchanging across groups in all, hidden "
                                         "behind training or not, timed where the exchange ran: device events on its "
                                         "stream on GPU, on CPU from launch to the first step end (or landing) "
                                         "that finds gloo done (rank max; the "
                                         "aggregation phase shows the exposed part when train.outer_delay overlaps "
                                         "it)", default=0.0)
    baseline_ppl: float | None = _doc("perplexity of the best context-free (unigram) model of the eval data: the "
                                      "chain's stationary distribution in closed form (synthetic), the eval tokens' "
                                      "own frequencies (text); a run whose eval_ppl is not below it has not learned",
                                      default=None)
    axes: dict = _doc("the keys a Hydra multirun swept (python -m launcher -m ...) and this run's values, as typed",
                      default_factory=dict)
    skipped_steps: int = _doc("steps whose update a federation group dropped for a non-finite loss or gradient "
                              "(train.on_nonfinite=skip_step; each group agrees alone), the most of any rank",
                              default=0)
    tp: int = _doc("tensor-parallel degree (train.tp)", default=1)
    pp: int = _doc("pipeline stages (train.pp)", default=1)
    microbatches: int | None = _doc("microbatches per step and pipeline when pp > 1, else null", default=None)
    compute_only_s: float | None = _doc("the mean step time less exposed_comm_s; null when not measured (results "
                                        "before 2026-12: compute-only steps run after training)", default=None)
    exposed_comm_s: float | None = _doc("communication (and waiting) compute did not hide, per step: the time the "
                                        "training thread spent blocked in collectives' waits (max over ranks per "
                                        "step, mean over the steps after the first); FedAvg events count, averaged "
                                        "per step. Measured, never modelled; null when not measured", default=None)
    exposed_comm_method: str | None = _doc("how exposed_comm_s was measured, or why it was not", default=None)
    energy_j: float | None = _doc("joules of the last attempt's training time (checkpoints, logging and evaluations "
                                  "left out), summed over one counter reader per node; null when any node has no "
                                  "counter (energy_source says why): never estimated from a TDP", default=None)
    avg_power_w_per_device: float | None = _doc("energy_j / the last attempt's training time / world_size",
                                                default=None)
    tokens_per_j: float | None = _doc("tokens of the last attempt / energy_j", default=None)
    first_step_s: float | None = _doc("the run's first step (max over ranks), where communicators are created and "
                                      "memory first allocated: in train_time_s, not in tokens_per_s; null when the "
                                      "run had one step", default=None)
    steady_step_s: float | None = _doc("seconds per step in steady state, beside train_time_s / steps: rank 0's "
                                       "training clock (checkpoints, logging, evaluation and compilation left out, "
                                       "as in train_time_s) from the end of step 2 to the last step, over the steps "
                                       "between (steps 1 and 2 carry communicator set-up and warm-up); with A, only "
                                       "the last whole aggregation periods after step 2 (a multiple of A steps, so a "
                                       "FedAvg counts 1/A, as the step-time model amortises it); on GPU the host's "
                                       "clock, which keeps the device's pace once its queue is full. Null with fewer "
                                       "than 3 steps (with A: fewer than A after step 2) and in results written "
                                       "before it was recorded", default=None)
    steady_steps: int | None = _doc("the steps steady_step_s covers", default=None)
    energy_source: str | None = _doc("nvml: or rapl: (with the number of node readers), or none: which node could "
                                     "not be measured and why", default=None)
    profile: dict | None = _doc("train.profile's traces: {steps: the steps recorded, traces: one Chrome/Perfetto "
                                "file per rank, relative to the run directory}; those steps ran under the "
                                "profiler, slower; null when not profiled", default=None)
    started_at: str | None = _doc("when the run's first attempt began training (ISO 8601 UTC): a prediction counts "
                                  "only if it was registered before", default=None)
    peak_reserved_bytes: int | None = _doc("max over ranks: the peak the CUDA caching allocator reserved (an "
                                           "out-of-memory follows it, not peak_memory_bytes); null on CPU",
                                           default=None)
    device_free_bytes: int | None = _doc("min over ranks: free device memory after training "
                                         "(torch.cuda.mem_get_info), what the CUDA context, NCCL's buffers and other "
                                         "processes left beside the reserved memory; null on CPU", default=None)
    device_total_bytes: int | None = _doc("the device's memory (torch.cuda.mem_get_info); null on CPU", default=None)
    alloc_conf: str | None = _doc("the caching allocator's setting (the job sets "
                                  "PYTORCH_ALLOC_CONF=expandable_segments:True unless the user set one); null on "
                                  "CPU", default=None)
    tf32: bool | None = _doc("train.tf32 as the run had it on CUDA (fp32 matmuls on TF32 tensor cores); null on "
                             "CPU", default=None)
    compile_graphs: int = _doc("graphs torch.compile traced while training (train.compile): one that every decoder "
                               "layer runs, one more once an evaluation ran within the steps (eval_every); the "
                               "final evaluation, after the training clock stops, is not counted", default=0)
    compile_recompiles: int = _doc("of those, traces of a frame traced before (evaluation's no-grad mode is one); "
                                   "more means a step recompiled", default=0)
    config: str | None = _doc("the configuration this run repeats: its layout's name and multirun point (the "
                              "spec's config); the report groups repeats by it. Null in results before 2026-12-06, "
                              "whose run_id carried it", default=None)
    repeat: int | None = _doc("which repeat of its configuration (seed = the sweep's train.seed + repeat - 1); null "
                              "before 2026-12-06", default=None)
    rank_order: str | None = _doc("who ordered the ranks: topology (fedshard's placement) or slurm; null before "
                                  "2026-12-06 (the sweep's manifest.jsonl has it)", default=None)
    machine: dict | None = _doc("the machine rank 0 ran on at the start of the last attempt "
                                "(train.contract.machine): host (a digest of its name, not the name), cpu, cores, "
                                "cores_usable, memory_bytes, kernel, load_avg (1, 5, 15 min), python, torch, fedshard, "
                                "commit (fedshard's, -dirty when its work tree differed; null outside a checkout), "
                                "gpu; null in results before 2026-12-07", default=None)
    groups: list[dict] | None = _doc("train.fault_tolerance=groups: per federation group, its starts (1: never "
                                     "lost), its losses (when, why, the step it healed at, seconds from the fault "
                                     "to that heal, tokens lost), its heals, the averages it missed (short_rounds), "
                                     "the tokens it trained and the tokens an average took in, and left_out (lost, "
                                     "and not back when the others ended: its job cancelled); null otherwise",
                                     default=None)
    goodput: float | None = _doc("train.fault_tolerance=groups: useful tokens (every group's steps that reached "
                                 "the final model, less those lost to faults and missed averages) / (world_size x "
                                 "train_time_s), per rank and second; null otherwise", default=None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def configuration(self) -> tuple[str, int]:
        """(config, repeat): the fields, or what a result written before they existed carried in its run_id."""
        return (self.config, self.repeat) if self.config is not None else legacy_repeat(self.run_id)

    def with_target(self, target_ppl: float | None) -> "RunResult":
        """This result judged against a target: time and step of its first evaluation at or below it. A target
        declared after the run (sweep.target=reference, from the reference runs) is applied this way too."""
        reached = target_crossing(self.eval_history, target_ppl)
        return dataclasses.replace(self, target_ppl=target_ppl, time_to_target_s=reached[1] if reached else None,
                                   steps_to_target=reached[0] if reached else None)

    @classmethod
    def from_dict(cls, raw: dict) -> "RunResult":
        if not isinstance(raw, dict):
            raise ResultError("a result must be a JSON object")
        reject_unknown("result", raw, _names(cls), ResultError)
        required = [f.name for f in dataclasses.fields(cls) if f.name not in raw
                    and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if required:
            raise ResultError(f"result is missing key(s): {', '.join(required)}")
        phases = raw["phases"]
        if not isinstance(phases, dict) or set(phases) != set(PHASES):
            raise ResultError(f"result phases must be {', '.join(PHASES)}, got {phases!r}")
        try:
            return cls(**{**raw, "phases": {p: Stats(**phases[p]) for p in PHASES},
                          "aggregation_event": Stats(**raw["aggregation_event"]),
                          "ranks": [RankRecord(**r) for r in raw["ranks"]]})
        except TypeError as exc:
            raise ResultError(f"result is malformed: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RunResult":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as exc:
            raise ResultError(f"{path}: not valid JSON ({exc})") from None
        except ResultError as exc:
            raise ResultError(f"{path}: {exc}") from None

    def save(self, path: str | os.PathLike) -> None:
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=2) + "\n")


def target_crossing(history: list[list], target_ppl: float | None) -> list | None:
    """The first [step, train_time_s, eval_ppl] of an eval history at or below target_ppl (None: not reached)."""
    return next((e for e in history if target_ppl is not None and e[2] <= target_ppl), None)


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _type_name(hint) -> str:
    args = typing.get_args(hint)
    if args and typing.get_origin(hint) not in (list, dict):  # X | None
        return " or ".join(_type_name(a) for a in args)  # "|" would split a markdown cell
    if args:
        return f"{typing.get_origin(hint).__name__}[{', '.join(_type_name(a) for a in args)}]"
    return "null" if hint is type(None) else hint.__name__


def schema_markdown() -> str:
    """docs/result-schema.md: one row per RunResult field, from its type and doc."""
    hints = typing.get_type_hints(RunResult)
    lines = ["# result.json", "", "Generated from `train/contract/result.py` by `python -m train.contract.result > "
             "docs/result-schema.md`; a test checks it is current.", "", RunResult.__doc__, "",
             "| key | type | meaning |", "| --- | --- | --- |"]
    for f in dataclasses.fields(RunResult):
        lines.append(f"| `{f.name}` | `{_type_name(hints[f.name])}` | {f.metadata['doc']} |")
    lines += ["", f"`Stats`: {{mean, std, n}}. {Stats.__doc__}", "",
              f"`RankRecord`: {{rank, host, node, topology_addr}}. {RankRecord.__doc__}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
