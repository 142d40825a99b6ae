"""The one place a model is cut into stages, split over its tensor-parallel group, checkpointed, compiled and sharded
(fully_shard), and where sharded weights are materialised identically in every group."""
from __future__ import annotations

import hashlib
import logging

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from train.contract.config import TrainConfig
from train.parallel import checkpointing, pipeline, tensor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision(precision: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """fp32: no casts. bf16: bf16 compute/all-gather over fp32 master weights. paper: parameters already bf16.
    Gradients are reduced in `reduce_dtype` whatever the backend (NCCL would otherwise reduce in the compute dtype),
    so a gloo run and a GPU run of one spec sum alike."""
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                                reduce_dtype=DTYPES[reduce_dtype])


def parallelize(model: torch.nn.Module, mesh: DeviceMesh, dp_mesh: DeviceMesh, cfg: TrainConfig,
                emulate_float8: bool = False) -> torch.nn.Module:
    """This rank's part of a whole LlamaForCausalLM (built on cpu from the seed, or on meta), in torchtitan's order:
    its decoder layers' matmuls in float8 (train.float8: train.parallel.float8), its pipeline stage, split over the
    tensor-parallel group (train.sequence_parallel: train.parallel.tensor), each layer checkpointed as
    train.activation_checkpointing says (train.parallel.checkpointing) and compiled (train.compile: torch.compile
    per layer, whose region holds the checkpoint and its recomputation but not FSDP2's hooks), then sharded over
    `dp_mesh` in train.precision, reducing in train.reduce_dtype."""
    if cfg.float8:
        from train.parallel import float8 as fp8

        fp8.convert(model, cfg.float8_all_gather, emulate_float8)
    model_plan = type(model)._tp_plan or {}
    pipelined = mesh["pp"].size() > 1
    if pipelined:
        model = pipeline.Stage(model, mesh["pp"].get_local_rank(), mesh["pp"].size())
    if mesh["tp"].size() > 1:
        layers = [f"model.layers.{name}" for name, _ in model.model.layers.named_children()]  # a stage's too
        tensor.apply(model, mesh["tp"], model.config, model_plan, layers, cfg.sequence_parallel)
    checkpointing.apply(pipeline.decoder_layers(model), cfg.activation_checkpointing)
    if cfg.compile:
        # transformers' output-capturing hooks write a module-level variable in a layer's forward, and its
        # checkpointing warns once that it drops the KV cache: neither needs tracing, nor replaying in backward
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
        torch._dynamo.config.ignore_logging_functions.add(logging.Logger.warning_once)
        for layer in pipeline.decoder_layers(model):
            layer.compile(fullgraph=True)  # in place: parameter names stay (FedAvg's alignment, checkpoints)
    return shard(model, dp_mesh, cfg.precision, cfg.reduce_dtype, pipelined, cfg.prefetch)


def shard(model: torch.nn.Module, dp_mesh: DeviceMesh, precision: str, reduce_dtype: str,
          pipelined: bool = False, prefetch: bool = True) -> torch.nn.Module:
    """torchtitan's FSDP units: the embedding, each decoder layer, and lm_head, which backward needs first and so
    stays gathered after forward, as does the root unit, which keeps the final norm (torchtitan's unit of [norm,
    lm_head] is reduced in two halves here, since transformers' Llama runs the norm inside its LlamaModel: the
    norm's backward, after lm_head's gradient is reduced, gathers the unit again). Tied embeddings (one parameter in
    two places) stay in the root unit too. Under pipeline parallelism no unit is resharded after forward: each
    microbatch's forward would gather it again. Without `prefetch` (train.prefetch=false) each unit's all-gather is
    issued only when the unit is reached (no_prefetch)."""
    if precision == "paper":
        cast(model, torch.bfloat16)
    options = {"mesh": dp_mesh, "mp_policy": mixed_precision(precision, reduce_dtype),
               "reshard_after_forward": not pipelined}
    ends = []  # the units holding what the root held before: they reduce as it did on gloo
    if not model.config.tie_word_embeddings:
        if model.model.embed_tokens is not None:
            ends.append(fully_shard(model.model.embed_tokens, **options))
        if model.lm_head is not None:
            ends.append(fully_shard(model.lm_head, **{**options, "reshard_after_forward": False}))
    for layer in pipeline.decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **{**options, "reshard_after_forward": False})
    if dp_mesh.device_type == "cpu":
        # gloo has no PREMUL_SUM: reduce with SUM and divide afterwards.
        for unit in (model, *ends):
            unit.set_force_sum_reduction_for_comms(True)
    if not prefetch:
        no_prefetch(model)
    return model


def no_prefetch(model: torch.nn.Module) -> None:
    """FSDP2 as the paper's FSDP1 ran (forward_prefetch=False, backward_prefetch=None): every unit's all-gather
    issued when the unit is reached and behind the compute already queued, so none overlaps compute. In forward the
    pre-forward unshard runs with async_op=True, on the compute stream rather than FSDP2's all-gather streams (which
    let the next unit's all-gather run beside this one's compute); in backward each unit names only itself to
    prefetch, which replaces FSDP2's default (the next unit in reverse order) and is a no-op, as the unit is already
    gathered by then. The collectives and their results are the same."""
    for unit in [m for m in model.modules() if isinstance(m, FSDPModule)]:
        unit.set_modules_to_backward_prefetch([unit])
        unit._set_unshard_async_op(True)  # FSDPModule's own switch (torch >= 2.6; private, documented there)


def cast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Module.to(dtype) for floating parameters and buffers, by assignment: Module.to swaps fake tensors in place,
    which fake tensor mode's own weak references forbid, so the dry-run (train.job.dryrun) could not build the
    model. A parameter shared by two modules (tied embeddings) stays shared."""
    done: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            for kind in (module._parameters, module._buffers):
                for name, t in kind.items():
                    if t is None or not t.is_floating_point():
                        continue
                    if id(t) not in done:
                        new = t.to(dtype)
                        done[id(t)] = torch.nn.Parameter(new, t.requires_grad) if kind is module._parameters else new
                    kind[name] = done[id(t)]


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's storage of a (possibly sharded) tensor: a view, to be modified in place."""
    return t.to_local() if isinstance(t, DTensor) else t


def materialize(model: torch.nn.Module, device: str, seed: int, shard_index: int, tp_index: int = 0) -> None:
    """Give a model sharded on the meta device real, identical-across-groups weights.

    Buffers (RoPE frequencies) and norms come from the model's own initialisation;
    random matrices are then drawn per local shard from a generator seeded by
    (seed, parameter name, shard index, tensor-parallel index), so every federation group
    and replica holds the same numbers while different shards of one matrix differ.
    """
    model.to_empty(device=device)
    with torch.no_grad():
        model.initialize_weights()
        std = model.config.initializer_range
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            where = f"{shard_index}/{tp_index}" if tp_index else str(shard_index)
            key = hashlib.blake2b(f"{seed}/{name}/{where}".encode(), digest_size=8).digest()
            gen = torch.Generator(device=device).manual_seed(int.from_bytes(key, "little") >> 1)
            local(param).normal_(0.0, std, generator=gen)


def clip_grad_norm(model: torch.nn.Module, max_norm: float, pp_mesh: DeviceMesh) -> None:
    """Scale the gradients so their global norm is at most `max_norm` (train.max_norm), as torchtitan clips: each
    DTensor gradient's norm reduced over its mesh (the group's shards, replicas and tensor-parallel ranks), the
    squares summed over the pipeline's stages; no host read (the scale is applied on the device)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    if pp_mesh.size() > 1:
        total = total ** 2
        dist.all_reduce(total, group=pp_mesh.get_group())
        total = total ** 0.5
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total, foreach=True)
