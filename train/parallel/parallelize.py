"""The one place a model is cut into stages, split over its tensor-parallel group and sharded (fully_shard), and
where sharded weights are materialised identically in every group."""
from __future__ import annotations

import functools
import hashlib

import torch
import torch.utils.checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from train.parallel import pipeline, tensor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision(precision: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """fp32: no casts. bf16: bf16 compute/all-gather over fp32 master weights. paper: parameters already bf16.
    Gradients are reduced in `reduce_dtype` whatever the backend (NCCL would otherwise reduce in the compute dtype),
    so a gloo run and a GPU run of one spec sum alike."""
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16" else None,
                                reduce_dtype=DTYPES[reduce_dtype])


def parallelize(model: torch.nn.Module, mesh: DeviceMesh, dp_mesh: DeviceMesh, precision: str, reduce_dtype: str,
                checkpointing: bool = False, sequence_parallel: bool = False) -> torch.nn.Module:
    """This rank's part of a whole LlamaForCausalLM (built on cpu from the seed, or on meta): its pipeline stage,
    split over the tensor-parallel group (`sequence_parallel`: train.parallel.tensor), then sharded over `dp_mesh`; with
    `checkpointing`, each decoder layer
    keeps only its input for backward and recomputes the rest (transformers' layers checkpoint their forward
    inside FSDP2's hooks, so the recomputation gathers nothing twice)."""
    model_plan = type(model)._tp_plan or {}
    if mesh["pp"].size() > 1:
        model = pipeline.Stage(model, mesh["pp"].get_local_rank(), mesh["pp"].size())
    if mesh["tp"].size() > 1:
        layers = [f"model.layers.{name}" for name, _ in model.model.layers.named_children()]  # a stage's too
        tensor.apply(model, mesh["tp"], model.config, model_plan, layers, sequence_parallel)
    if checkpointing:
        for layer in pipeline.decoder_layers(model):
            layer.gradient_checkpointing = True
            layer._gradient_checkpointing_func = functools.partial(torch.utils.checkpoint.checkpoint,
                                                                   use_reentrant=False)
    return shard(model, dp_mesh, precision, reduce_dtype)


def shard(model: torch.nn.Module, dp_mesh: DeviceMesh, precision: str, reduce_dtype: str) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (embedding, final norm, lm_head)."""
    if precision == "paper":
        cast(model, torch.bfloat16)
    policy = mixed_precision(precision, reduce_dtype)
    for layer in pipeline.decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    if dp_mesh.device_type == "cpu":
        # gloo has no PREMUL_SUM: reduce with SUM and divide afterwards.
        model.set_force_sum_reduction_for_comms(True)
    return model


def cast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Module.to(dtype) for floating parameters and buffers, by assignment: Module.to swaps fake tensors in place,
    which fake tensor mode's own weak references forbid, so the dry-run (train.measure.dryrun) could not build the
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
