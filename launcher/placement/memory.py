"""Bytes one device holds at its peak for a layout: sharded training state, the units FSDP gathers, activations
and FedAvg's buffer. Pure arithmetic, so a plan refuses a layout that cannot fit before anything is submitted.

Per rank, a pipeline stage holds ceil(L / pp) layers, each split over tp ranks (train.parallel.tensor: every matrix of a
block; the norms are ignored), and the embedding (first stage) or the vocabulary-split lm_head (last stage);
FSDP then shards that over S. What is held:
- state, per sharded parameter: the parameter and AdamW's two moments (4 + 8 bytes; 2 + 4 with precision=paper,
  whose parameters are bf16; set_to_none frees the sharded gradient before the activation peak at the start of
  backward); DiLoCo (or a compressed or streamed exchange) adds its synchronized copy and momentum, fp32 whatever
  the precision (train.federation.outer), unless train.outer_offload moves them to host memory;
- gathered (train.parallel.parallelize.shard's units): lm_head and the final norm, kept gathered after forward, and two
  decoder layers (the one computing and the one prefetched) unsharded in the compute dtype (the embedding is
  resharded after forward; tied embeddings stay gathered with the head), with two layers' unsharded gradients
  before their reduce-scatter (fully_shard copies them out even on a one-rank shard group), in the larger of the
  compute dtype and train.reduce_dtype (FSDP casts them to the reduce dtype, and under pp accumulates them in
  it). Under pp no unit reshards after forward and torch's pipelining turns FSDP's gradient reduction and
  resharding after backward off until the last microbatch: the whole stage stays unsharded through the step,
  and every layer keeps its unsharded gradient from the first backward on (_stage);
- activations saved for backward, per token and layer (counted with autograd's saved-tensor hooks on
  transformers' Llama block, sdpa keeping no score matrix): 5h not split by tp (the block input, the norms'
  normalised inputs and outputs, the attention residual), then 3h + 2h_kv for attention (q and the output
  before and after o_proj's reshape; k, v) and 4i for the MLP (gate, SiLU, up, product), split by tp; with
  sequence parallelism the 5h are split by tp too, and the all-gathered inputs of attention and the MLP (2h)
  are saved whole;
- the loss: the fp32 log-softmax kept for backward (4 bytes per logit, for every microbatch in flight) and, for
  the batch or microbatch in backward, its gradient and the logits' fp32 gradient (8 bytes per logit), with or
  without tp (the gathered logits take the place of the unsplit ones; measured by the dry-run at tp 2 and 4). It
  peaks at the start of backward, while every layer's activations are held, except with activation
  checkpointing, where each layer keeps only its input (full) or its input and what torchtitan's policy saves
  (selective, train.parallel.checkpointing: q, v, attention's output, gate, and down's output, which tp does
  not split), and one layer's activations are live while it is recomputed, after the loss is freed (the larger
  of the two counts). Tokens in flight: the rank's batch; under
  pp, GPipe keeps every microbatch, 1F1B at most pp of them on the first stage and one on the last;
- the FedAvg flat buffer: the rank's shard up to train.federation.federated's chunk, with this replica's 1/R piece
  of it when R > 1 and a receive buffer of the piece's size for a 16-bit exchange.
Gloo's own scratch copies, made in its worker threads, are not counted (NCCL reduces in place).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.placement.steptime import Shapes, root_units, stage_shapes
from train.contract.layout import Layout
from train.contract.spec import FEDAVG_CHUNK_BYTES, RunSpec

STATE_BYTES = {"fp32": 16, "bf16": 16, "paper": 8}  # parameter + gradient + AdamW's two moments, per parameter
PARAM_BYTES = {"fp32": 4, "bf16": 4, "paper": 2}     # as stored (bf16 keeps fp32 master weights)
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "paper": 2}   # gathered parameters and activations
REDUCE_BYTES = {"fp32": 4, "bf16": 2}                # train.reduce_dtype
# per logit at the start of backward: the fp32 log-softmax kept for backward, then its gradient and the logits'
# fp32 gradient (the dry-run at 8B: 12.3 B in all with checkpointing, 16.4 B without)
LOSS_SAVED_BYTES, LOSS_GRAD_BYTES = 4, 8


@dataclass(frozen=True)
class DeviceWork:
    """What the memory of one device depends on besides the model: its layout and what each step holds."""

    layout: Layout
    batch: float = 1
    seq_len: int = 128
    microbatches: int = 1
    schedule: str = "1f1b"
    precision: str = "fp32"
    reduce_dtype: str = "fp32"
    outer_copy: bool = False  # DiLoCo, or a compressed or streamed exchange, with its state on the device
    checkpointing: str = "none"  # train.activation_checkpointing: none, full or selective
    whole_heads: bool = False  # fp32 on CUDA repeats the KV heads for SDPA (train.model): k and v kept at full width
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


def work_of(spec: RunSpec) -> DeviceWork:
    t = spec.train
    copy = spec.federated and (t.outer != "fedavg" or t.aggregation_dtype != "fp32" or t.streamed)
    return DeviceWork(spec.layout, batch=t.batch_per_rank, seq_len=t.seq_len, microbatches=spec.microbatches,
                      schedule=t.pp_schedule, precision=t.precision, reduce_dtype=t.reduce_dtype,
                      outer_copy=copy and not t.outer_offload, checkpointing=t.activation_checkpointing,
                      whole_heads=spec.device == "cuda" and t.precision == "fp32" and _kv_hidden(
                          spec.model.llama_kwargs) < spec.model.llama_kwargs["hidden_size"],
                      sequence_parallel=t.sequence_parallel)


def per_device(llama_kwargs: dict, work: DeviceWork) -> Memory:
    """Peak bytes of the device holding the most (module docstring)."""
    W, L = work, work.layout
    shapes = Shapes.of(llama_kwargs)
    stage = stage_shapes(shapes, L.P, L.T)
    root, layers, layer = stage.root, stage.layers * stage.layer, stage.layer
    sharded = (root + layers) / L.S
    param_b, compute_b = PARAM_BYTES[W.precision], COMPUTE_BYTES[W.precision]
    grad_b = 4 if W.precision != "paper" else 2  # sharded, in the parameters' dtype
    state = sharded * (STATE_BYTES[W.precision] - grad_b + (2 * 4 if W.outer_copy else 0))
    unsharded_grad_b = max(compute_b, REDUCE_BYTES[W.reduce_dtype])
    buffers = 0.0
    if L.federated:  # the flat chunk, this replica's piece of it (R > 1), a 16-bit exchange's receive buffer
        piece = 1 / L.R
        buffers = min(sharded * param_b, FEDAVG_CHUNK_BYTES) * (1 + (piece if L.R > 1 else 0)
                                                                + (piece if param_b == 2 else 0))
    per_token = _per_token_layer(llama_kwargs, L.T, W.sequence_parallel, W.whole_heads) * compute_b
    activations = functools.partial(_activations, llama_kwargs, W, stage.layers, per_token)
    if L.P == 1:
        # lm_head and the norm (the embedding resharded after forward), the layer computing and the one prefetched;
        # the two layers' gradients before their reduce-scatter (fully_shard copies them out even on one rank)
        working = (root_units(shapes, L.T)[1] + 2 * layer) * compute_b
        tokens = W.batch * W.seq_len
        return Memory(state, working + 2 * layer * unsharded_grad_b, activations(tokens, tokens, tokens), buffers)
    unsharded = (root + layers) * compute_b
    return max((_stage(W, activations, unsharded, (root + layers) * unsharded_grad_b, last, state, buffers)
                for last in (False, True)), key=lambda m: m.total)


def _stage(W: DeviceWork, activations, unsharded: float, grads: float, last: bool, state: float,
           buffers: float) -> Memory:
    """The first or the last pipeline stage at its peak. No unit reshards after forward under pp, and torch's
    pipelining turns FSDP's gradient reduction and its resharding after backward off until the last microbatch:
    the stage stays unsharded through the step and each layer keeps its unsharded gradient from the first
    backward on. The peak is at the start of a backward, with k microbatches in flight (GPipe: all m; 1F1B: P on
    the first stage, one on the last): one that follows a forward (k microbatches, the gradients held unless it
    is the first backward) or, on the first stage, one that follows a backward (k - 1 microbatches, the
    gradients held)."""
    m = W.microbatches
    k = m if W.schedule == "gpipe" else (1 if last else min(m, W.layout.P))
    micro = W.batch * W.seq_len / m

    def held(n: int) -> float:  # n microbatches' activations, and the last stage's loss over them
        return activations(n * micro, n * micro if last else 0.0, micro)

    after_forward = Memory(state, unsharded + (grads if m > k else 0.0), held(k), buffers)
    if k == 1:
        return after_forward
    return max(after_forward, Memory(state, unsharded + grads, held(k - 1), buffers), key=lambda mem: mem.total)


def _activations(llama_kwargs: dict, W: DeviceWork, n_layers: int, per_token: float, tokens: float,
                 logits_tokens: float, live_tokens: float) -> float:
    """Bytes held at the start of a backward: what `tokens` saved through `n_layers` layers, the loss's saved
    tensors over `logits_tokens` and its gradients over `live_tokens` (the batch, or the microbatch in backward);
    with activation checkpointing each layer keeps its input (and, selective, what the policy saves), and
    `live_tokens` through one layer are live while it is recomputed, after the loss is freed."""
    loss = (logits_tokens * LOSS_SAVED_BYTES + live_tokens * LOSS_GRAD_BYTES) * llama_kwargs["vocab_size"] \
        if logits_tokens else 0.0
    if W.checkpointing == "none":
        return tokens * n_layers * per_token + loss
    kept = _kept_per_token_layer(llama_kwargs, W.layout.T, W.sequence_parallel, W.checkpointing == "selective")
    return tokens * n_layers * kept * COMPUTE_BYTES[W.precision] + max(loss, live_tokens * per_token)


def _kept_per_token_layer(llama_kwargs: dict, T: int, sequence_parallel: bool, selective: bool) -> float:
    """Elements a checkpointed layer keeps per token (module docstring): its input (split by tp under sequence
    parallelism); selective adds q, v, attention's output and gate (split by tp), down's output (tp's partial
    sums, whole) and, under sequence parallelism, its reduce-scatter's."""
    h = llama_kwargs["hidden_size"]
    sp = sequence_parallel and T > 1
    kept = h / T if sp else h
    if selective:
        kept += (2 * h + _kv_hidden(llama_kwargs) + llama_kwargs["intermediate_size"]) / T + h + (h / T if sp else 0.0)
    return kept


def _kv_hidden(llama_kwargs: dict) -> int:
    """Width of the keys (and of the values) per token: the KV heads' share of the hidden size."""
    heads = llama_kwargs["num_attention_heads"]
    return llama_kwargs["hidden_size"] // heads * (llama_kwargs.get("num_key_value_heads") or heads)


def _per_token_layer(llama_kwargs: dict, T: int, sequence_parallel: bool = False, whole_heads: bool = False) -> float:
    """Elements one decoder layer saves for backward per token (module docstring); k and v at the query heads'
    width where attention repeats the KV heads (whole_heads)."""
    h, i = llama_kwargs["hidden_size"], llama_kwargs["intermediate_size"]
    split = (3 * h + 2 * (h if whole_heads else _kv_hidden(llama_kwargs)) + 4 * i) / T
    return split + (5 * h / T + 2 * h if sequence_parallel and T > 1 else 5 * h)


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB', 4.13e12 -> '4.13 TB' (decimal units, as disks and links are sold)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
