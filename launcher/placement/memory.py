"""Bytes one device holds at its peak for a layout: sharded training state, the units FSDP gathers, activations
and FedAvg's buffer. Pure arithmetic, so a plan refuses a layout that cannot fit before anything is submitted.

Per rank, a pipeline stage holds ceil(L / pp) layers, each split over tp ranks (train.tensor: every matrix of a
block; the norms are ignored), and the embedding (first stage) or the vocabulary-split lm_head (last stage);
FSDP then shards that over S. What is held:
- state, per sharded parameter: the parameter and AdamW's two moments (4 + 8 bytes; 2 + 4 with precision=paper,
  whose parameters are bf16), and its gradient (4 or 2) under pipeline stages, which keep it across
  microbatches (otherwise set_to_none frees it before the activation peak at the start of backward); DiLoCo (or
  a compressed or streamed exchange) adds its synchronized copy and momentum, fp32 whatever the precision
  (train.outer), unless train.outer_offload moves them to host memory;
- gathered: the root unit and two decoder layers (the one computing and the one prefetched) unsharded in the
  compute dtype, with their unsharded gradients before the reduce-scatter (fully_shard copies them out even on
  a one-rank shard group); under pp the whole stage, which torch's pipelining keeps unsharded, gradients
  included, from the first microbatch's forward to the last one's backward;
- activations saved for backward, per token and layer (counted with autograd's saved-tensor hooks on
  transformers' Llama block, sdpa keeping no score matrix): 5h not split by tp (the block input, the norms'
  normalised inputs and outputs, the attention residual), then 3h + 2h_kv for attention (q and the output
  before and after o_proj's reshape; k, v) and 4i for the MLP (gate, SiLU, up, product), split by tp; with
  sequence parallelism the 5h are split by tp too, and the all-gathered inputs of attention and the MLP (2h)
  are saved whole;
- the loss: the fp32 log-softmax and its gradient (8 bytes per logit), and under tp the rank's vocabulary slice
  of the logits and their gathered copy; it peaks at the start of backward, while every layer's activations
  are held, except with activation checkpointing, where each layer keeps only its input and one layer's
  activations are live while it is recomputed, after the loss is freed (the larger of the two counts).
  Tokens in flight: the rank's batch; under pp, GPipe keeps every microbatch, 1F1B at most pp of them on the
  first stage and one on the last;
- the FedAvg flat buffer: the rank's shard up to train.federated's chunk (twice for a 16-bit exchange).
Gloo's own scratch copies, made in its worker threads, are not counted (NCCL reduces in place).
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.placement.steptime import Shapes, stage_shapes
from train.spec import FEDAVG_CHUNK_BYTES, RunSpec

STATE_BYTES = {"fp32": 16, "bf16": 16, "paper": 8}  # parameter + gradient + AdamW's two moments, per parameter
PARAM_BYTES = {"fp32": 4, "bf16": 4, "paper": 2}     # as stored (bf16 keeps fp32 master weights)
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "paper": 2}   # gathered parameters and activations


@dataclass(frozen=True)
class Layout:
    """What the memory of one device depends on besides the model."""

    S: int
    P: int = 1
    T: int = 1
    batch: int = 1
    seq_len: int = 128
    microbatches: int = 1
    schedule: str = "1f1b"
    precision: str = "fp32"
    federated: bool = False
    outer_copy: bool = False  # DiLoCo, or a compressed or streamed exchange, with its state on the device
    checkpointing: bool = False
    sequence_parallel: bool = False  # under tp: the block's unsplit activations are split too, but for the
                                     # gathered inputs of attention and the MLP


@dataclass(frozen=True)
class Memory:
    state: float
    gathered: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.state + self.gathered + self.activations + self.buffers

    def to_dict(self) -> dict:
        return {"state": self.state, "gathered": self.gathered, "activations": self.activations,
                "buffers": self.buffers, "total": self.total}


def layout_of(spec: RunSpec) -> Layout:
    t = spec.train
    copy = spec.federated and (t.outer != "fedavg" or t.aggregation_dtype != "fp32" or t.streamed)
    return Layout(S=spec.S, P=t.pp, T=t.tp, batch=t.batch_per_rank, seq_len=t.seq_len, microbatches=t.n_microbatches,
                  schedule=t.pp_schedule, precision=t.precision, federated=spec.federated,
                  outer_copy=copy and not t.outer_offload, checkpointing=t.activation_checkpointing,
                  sequence_parallel=t.sequence_parallel)


def per_device(llama_kwargs: dict, layout: Layout) -> Memory:
    """Peak bytes of the device holding the most (module docstring)."""
    L = layout
    stage = stage_shapes(Shapes.of(llama_kwargs), L.P, L.T)
    root, layers = stage.root, stage.layers * stage.layer
    sharded = (root + layers) / L.S
    param_b, compute_b = PARAM_BYTES[L.precision], COMPUTE_BYTES[L.precision]
    grad_b = 4 if L.precision != "paper" else 2
    state = sharded * (STATE_BYTES[L.precision] - (grad_b if L.P == 1 else 0) + (2 * 4 if L.outer_copy else 0))
    layer = stage.layer
    if L.P > 1:  # torch's pipelining keeps the stage unsharded from its first microbatch to its last backward
        gathered = (root + layers) * (compute_b + grad_b)
    else:  # fully_shard copies out even on one rank
        gathered = (root + 2 * layer) * compute_b + 2 * layer * grad_b
    in_flight = L.batch * L.seq_len
    if L.P > 1 and L.schedule == "1f1b":
        in_flight *= min(L.microbatches, L.P) / L.microbatches
    micro = L.batch * L.seq_len / (L.microbatches if L.P > 1 else 1)
    per_token = _per_token_layer(llama_kwargs, L.T, L.sequence_parallel)
    logits_tokens = micro if L.P > 1 and L.schedule == "1f1b" else L.batch * L.seq_len
    loss = logits_tokens * llama_kwargs["vocab_size"] * (8 + (compute_b * (1 + 1 / L.T) if L.T > 1 else 0))
    if L.checkpointing:
        saved = in_flight * stage.layers * llama_kwargs["hidden_size"] * compute_b
        peak = saved + max(loss, micro * per_token * compute_b)
    else:
        saved = in_flight * stage.layers * per_token * compute_b
        peak = saved + loss if L.P == 1 else max(saved, loss)  # the first stage holds the most, the last the loss
    buffers = 0.0
    if L.federated:
        shard_bytes = sharded * param_b
        buffers = min(shard_bytes, FEDAVG_CHUNK_BYTES) * (2 if param_b == 2 else 1)
    return Memory(state, gathered, peak, buffers)


def _per_token_layer(llama_kwargs: dict, T: int, sequence_parallel: bool = False) -> float:
    """Elements one decoder layer saves for backward per token (module docstring)."""
    h, i = llama_kwargs["hidden_size"], llama_kwargs["intermediate_size"]
    heads = llama_kwargs["num_attention_heads"]
    h_kv = h // heads * (llama_kwargs.get("num_key_value_heads") or heads)
    split = (3 * h + 2 * h_kv + 4 * i) / T
    return split + (5 * h / T + 2 * h if sequence_parallel and T > 1 else 5 * h)
