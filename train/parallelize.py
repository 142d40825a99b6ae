"""The one place fully_shard is applied, and where sharded weights are materialised identically in every group."""
from __future__ import annotations

import hashlib

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """fp32: no casts. bf16: bf16 compute/all-gather over fp32 master weights. paper: parameters already bf16."""
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard(model: torch.nn.Module, dp_mesh: DeviceMesh, precision: str) -> torch.nn.Module:
    """fully_shard each decoder layer, then the root (embedding, final norm, lm_head)."""
    if precision == "paper":
        model.to(torch.bfloat16)
    policy = mixed_precision(precision)
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    if dp_mesh.device_type == "cpu":
        # gloo has no PREMUL_SUM: reduce with SUM and divide afterwards.
        model.set_force_sum_reduction_for_comms(True)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's storage of a (possibly sharded) tensor: a view, to be modified in place."""
    return t.to_local() if isinstance(t, DTensor) else t


def materialize(model: torch.nn.Module, device: str, seed: int, shard_index: int) -> None:
    """Give a model sharded on the meta device real, identical-across-groups weights.

    Buffers (RoPE frequencies) and norms come from the model's own initialisation;
    random matrices are then drawn per local shard from a generator seeded by
    (seed, parameter name, shard index), so every federation group and replica holds
    the same numbers while different shards of one matrix differ.
    """
    model.to_empty(device=device)
    with torch.no_grad():
        model.initialize_weights()
        std = model.config.initializer_range
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                continue
            key = hashlib.blake2b(f"{seed}/{name}/{shard_index}".encode(), digest_size=8).digest()
            gen = torch.Generator(device=device).manual_seed(int.from_bytes(key, "little") >> 1)
            local(param).normal_(0.0, std, generator=gen)
