"""FedAvg is exact whatever the parameter dtype: averaging identical models changes no bit, and averaging
different ones gives every group the float64 mean rounded once (gloo ranks, bf16 and fp32 parameters)."""
import zlib

import pytest
import torch
from torch.distributed.fsdp import fully_shard

from tests.distributed import run_ranks
from train import mesh as meshes
from train.federated import FedAvg
from train.parallelize import local

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _model(dp_mesh, dtype):
    """Odd sizes, so shards are uneven and the flat buffer needs padding to a multiple of F."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.Linear(53, 29)).to(dtype)
    for layer in model:
        fully_shard(layer, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh)


def _noise(f: int, s: int, name: str, shape) -> torch.Tensor:
    """Group f's departure from the common model on shard s: the same in every replica of f."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{f}/{s}/{name}".encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


@torch.no_grad()
def _check(rank, strategy, F, R, S, dtype):
    """(averaging identical models changed nothing, averaging different ones gave the exact mean)."""
    mesh = meshes.build("cpu", F, R, S)
    f, _, s = meshes.coords(rank, F, R, S)
    model = _model(meshes.data_parallel_mesh(mesh, strategy), dtype)
    fedavg = FedAvg(model, torch.optim.AdamW(model.parameters()), mesh, A=1, chunk_bytes=2000)  # several chunks
    params = [(name, local(p)) for name, p in model.named_parameters()]
    before = [t.clone() for _, t in params]
    fedavg.average()
    unchanged = all(torch.equal(b.view(torch.uint8), t.view(torch.uint8)) for b, (_, t) in zip(before, params))
    # Now the groups differ; every rank can compute what the others hold, so it knows the exact mean.
    for (name, t), base in zip(params, before):
        t.copy_((base.double() + _noise(f, s, name, t.shape)).to(dtype))
    fedavg.average()
    exact = True
    for (name, t), base in zip(params, before):
        copies = torch.stack([(base.double() + _noise(g, s, name, t.shape)).to(dtype).double() for g in range(F)])
        exact &= torch.equal(copies.mean(dim=0).to(dtype).view(torch.uint8), t.view(torch.uint8))
    return unchanged, exact


def _worker(rank, world, F):
    """FL+FSDP (F, 1, world/F) and FL+HSDP (F, 2, world/2F) on the same ranks, in bf16 and fp32."""
    layouts = {"fl_fsdp": (F, 1, world // F), "fl_hsdp": (F, 2, world // (2 * F))}
    return {(strategy, name): _check(rank, strategy, *layout, dtype)
            for strategy, layout in layouts.items() for name, dtype in DTYPES.items()}


@pytest.mark.parametrize("F,world", [(3, 12), (16, 32)])
def test_averaging_is_exact(F, world):
    results = run_ranks(_worker, world, F)
    for case in results[0]:
        assert all(r[case][0] for r in results), f"{case}: averaging identical models changed weights"
        assert all(r[case][1] for r in results), f"{case}: the average is not the float64 mean rounded once"
