"""Tensor parallelism from the plan transformers ships with the model, not a hand-written one.

LlamaConfig.base_model_tp_plan splits each block Megatron's way: q/k/v/gate/up column-wise (each rank keeps
whole heads, so attention needs no communication), o/down row-wise (one all-reduce after attention and one
after the MLP); the model class's plan splits lm_head's vocabulary and gathers the logits. Embedding and norms
stay whole on every rank of the group: their inputs are replicated, so their gradients come out identical.
fully_shard then shards the resulting DTensors over the data-parallel mesh (FSDP2's 2-D composition).
"""
from __future__ import annotations

from fnmatch import fnmatchcase

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from .errors import SpecError

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


def apply(model: torch.nn.Module, tp_mesh: DeviceMesh, config, model_plan: dict[str, str]) -> None:
    """Split `model`'s matrices over the tensor-parallel group in place. Every rank holds the same full weights
    (or meta tensors), so each keeps its slice without communicating (src_data_rank=None)."""
    parallelize_module(model, tp_mesh, plan(model, config, model_plan), src_data_rank=None)
