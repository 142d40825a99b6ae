"""Activation checkpointing of decoder layers (train.activation_checkpointing): full, or selective by torchtitan's
op-level policy, which trades a little recomputation for much less memory than keeping everything.

transformers' decoder layers checkpoint their `forward` (inside FSDP2's hooks, so the recomputation in backward
finds the layer's parameters already gathered, and inside torch.compile's region when the layer is compiled);
this module only chooses what the checkpoint keeps.
- full: the layer's input; everything else is recomputed in backward.
- selective (torchtitan's `selective_ac_option = "op"`, its Llama-3 8B default; its other option, every k-th
  layer checkpointed in full, is not offered): the layer's input, the outputs of attention and of every other
  matmul in the order the layer runs them (q, v, gate and down projections of transformers' Llama block), and a
  reduce-scatter's output (sequence parallelism); the rest (k, o, up, norms, activations) is recomputed.
"""
from __future__ import annotations

import functools
from collections import defaultdict

import torch
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

aten = torch.ops.aten
SAVED = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
         aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default,
         aten._scaled_dot_product_flash_attention_for_cpu.default,
         torch.ops._c10d_functional.reduce_scatter_tensor.default,
         aten.max.default}  # a float8 scale's amax (torchtitan saves it: recomputing it would rescale)


def selective_context():
    """A fresh policy per checkpointed call: matmuls are counted apart in forward and in the recomputation, so
    both keep the same ones (odd-numbered)."""
    matmuls: dict[bool, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func is aten.mm.default:
            matmuls[ctx.is_recompute] += 1
        keep = func in SAVED and not (func is aten.mm.default and matmuls[ctx.is_recompute] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply(layers: list[torch.nn.Module], mode: str) -> None:
    """Checkpoint each layer as `mode` says (none, full, selective)."""
    if mode == "none":
        return
    options = {"context_fn": selective_context} if mode == "selective" else {}
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint,
                                                               use_reentrant=False, **options)
