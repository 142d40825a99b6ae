"""Tensor parallelism from the plan transformers ships with the model, not a hand-written one.

LlamaConfig.base_model_tp_plan splits each block Megatron's way: q/k/v/gate/up column-wise (each rank keeps
whole heads, so attention needs no communication), o/down row-wise (one all-reduce after attention and one
after the MLP); the model class's plan splits lm_head's vocabulary and gathers the logits. Embedding and norms
stay whole on every rank of the group: their inputs are replicated, so their gradients come out identical.
fully_shard then shards the resulting DTensors over the data-parallel mesh (FSDP2's 2-D composition).

With sequence parallelism (train.sequence_parallel, Korthikanti et al.) the residual stream between a stage's
first and last decoder layer is split along the sequence instead of replicated: the two RMSNorms of each block
run on the rank's tokens only (SequenceParallel), the attention and MLP inputs are all-gathered where the
column-wise matrices need them, and o/down reduce-scatter instead of all-reducing. The stage's first layer
takes its slice of the replicated input (no communication) and its last layer gathers the output back, so the
embedding, the final norm, lm_head and the pipeline's stage boundaries see what they see without it.
"""
from __future__ import annotations

from fnmatch import fnmatchcase

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from train.contract.common import SpecError

STYLES = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
}


def plan(model: torch.nn.Module, config, model_plan: dict[str, str]) -> dict[str, ParallelStyle]:
    """Module name -> style for the modules of `model` (a whole LlamaForCausalLM or one pipeline stage, with the
    same names) that the shipped plans cover: base_model_tp_plan under `model.`, and the class's own plan."""
    patterns = {f"model.{k}": v for k, v in (config.base_model_tp_plan or {}).items()} | dict(model_plan)
    out = {}
    for name, _ in model.named_modules():
        for pattern, style in patterns.items():
            if _matches(name, pattern):
                if style not in STYLES:
                    raise SpecError(f"train.tp: the model's tensor-parallel plan asks for {style!r} on {name}, "
                                    f"which fedshard does not apply (it knows {', '.join(STYLES)})")
                out[name] = STYLES[style]()
    return out


def _matches(name: str, pattern: str) -> bool:
    """`*` stands for one whole name component (a layer index), as in transformers' plans."""
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(fnmatchcase(p, w) for p, w in zip(parts, wanted))


SEQUENCE = Shard(1)  # (batch, sequence, hidden): the sequence dimension


def sequence_plan(layers: list[str]) -> dict[str, ParallelStyle]:
    """The styles sequence parallelism adds to `plan` for the decoder layers named `layers` (in order); it
    replaces the shipped plan's row-wise o_proj and down_proj by ones that reduce-scatter along the sequence."""
    enter = {"input_layouts": (Replicate(),), "desired_input_layouts": (SEQUENCE,)}
    leave = {"output_layouts": SEQUENCE, "desired_output_layouts": Replicate()}
    if len(layers) == 1:  # a stage of one layer slices and gathers around it
        out: dict[str, ParallelStyle] = {layers[0]: PrepareModuleInputOutput(**enter, use_local_input=True, **leave)}
    else:
        out = {layers[0]: PrepareModuleInput(**enter, use_local_output=True), layers[-1]: PrepareModuleOutput(**leave)}
    for layer in layers:
        out |= {f"{layer}.input_layernorm": SequenceParallel(),
                f"{layer}.post_attention_layernorm": SequenceParallel(),
                f"{layer}.self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": SEQUENCE},
                                                         desired_input_kwarg_layouts={"hidden_states": Replicate()},
                                                         use_local_output=True),
                f"{layer}.self_attn.o_proj": RowwiseParallel(output_layouts=SEQUENCE),
                f"{layer}.mlp": PrepareModuleInput(input_layouts=(SEQUENCE,), desired_input_layouts=(Replicate(),),
                                                   use_local_output=True),
                f"{layer}.mlp.down_proj": RowwiseParallel(output_layouts=SEQUENCE)}
    return out


def apply(model: torch.nn.Module, tp_mesh: DeviceMesh, config, model_plan: dict[str, str], layers: list[str],
          sequence_parallel: bool = False) -> None:
    """Split `model`'s matrices over the tensor-parallel group in place. Every rank holds the same full weights
    (or meta tensors), so each keeps its slice without communicating (src_data_rank=None). `layers`: the names
    of the decoder layers `model` holds, in order (for sequence parallelism)."""
    styles = plan(model, config, model_plan) | (sequence_plan(layers) if sequence_parallel else {})
    parallelize_module(model, tp_mesh, styles, src_data_rank=None)
