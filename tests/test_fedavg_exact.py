"""FedAvg accumulates in fp32 whatever the parameter dtype: averaging identical bf16 models changes no bit,
different models get the exact mean to within one rounding, and every group the same bits (gloo ranks)."""
import zlib

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tests.support import grid, run_ranks
from train.federation.federated import FedAvg
from train.parallel import mesh as meshes
from train.parallel.parallelize import local

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _model(dp_mesh, dtype, tp_mesh=None):
    """Odd sizes, so shards are uneven and the flat buffer needs padding to a multiple of F."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(37, 53), torch.nn.Linear(53, 29)).to(dtype)
    if tp_mesh is not None:
        parallelize_module(model, tp_mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()}, src_data_rank=None)
    for layer in model:
        fully_shard(layer, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh)


def _noise(f: int, s: int, name: str, shape) -> torch.Tensor:
    """Group f's departure from the common model on shard s: the same in every replica of f."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{f}/{s}/{name}".encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two tensors of one float dtype (same signs)."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return int((a.view(ints).long() - b.view(ints).long()).abs().max()) if a.numel() else 0


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """The spacing of t's dtype at |t|."""
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype]
    magnitude = t.abs()
    return (magnitude.view(ints) + 1).view(t.dtype) - magnitude


@torch.no_grad()
def _check(rank, strategy, F, R, S, dtype, T=1):
    """(ulps that averaging identical models moved, error after averaging different models as a fraction of
    what fp32 accumulation allows, whether every group holds the same bits). With T > 1 the two layers are
    split column- then row-wise over the tensor-parallel group before fully_shard, as train.parallel.tensor splits
    them."""
    mesh = meshes.build("cpu", grid(F, R, S, 1, T))
    f, _, s, _, _ = grid(F, R, S, 1, T).coords(rank)
    model = _model(meshes.data_parallel_mesh(mesh, strategy), dtype, mesh["tp"] if T > 1 else None)
    fedavg = FedAvg(model, torch.optim.AdamW(model.parameters()), mesh, A=1, chunk_bytes=2000)  # several chunks
    params = [(name, local(p)) for name, p in model.named_parameters()]
    before = [t.clone() for _, t in params]
    fedavg.average()
    moved = max(_ulps(b, t) for b, (_, t) in zip(before, params))
    # Now the groups differ; every rank can compute what the others hold, so it knows the exact mean.
    for (name, t), base in zip(params, before):
        t.copy_((base.double() + _noise(f, s, name, t.shape)).to(dtype))
    fedavg.average()
    worst = 0.0
    for (name, t), base in zip(params, before):
        copies = torch.stack([(base.double() + _noise(g, s, name, t.shape)).to(dtype).double() for g in range(F)])
        # One rounding to the dtype, plus fp32 summation error (it scales with the inputs' size, not the mean's).
        allowed = _ulp(t).double() + 4 * torch.finfo(torch.float32).eps * copies.abs().mean(dim=0)
        worst = max(worst, ((t.double() - copies.mean(dim=0)).abs() / allowed).max().item())
    everyone = [None] * dist.get_world_size(mesh.get_group("fed"))
    dist.all_gather_object(everyone, [t.view(torch.uint8).tolist() for _, t in params], group=mesh.get_group("fed"))
    return moved, worst, all(e == everyone[0] for e in everyone)


def _worker(rank, world, F):
    """FL+FSDP (F, 1, world/F) and FL+HSDP (F, 2, world/2F) on the same ranks, in bf16 and fp32."""
    layouts = {"fl_fsdp": (F, 1, world // F), "fl_hsdp": (F, 2, world // (2 * F))}
    return {(strategy, name): _check(rank, strategy, *layout, dtype)
            for strategy, layout in layouts.items() for name, dtype in DTYPES.items()}


def _tp_worker(rank, world, F):
    """FL+FSDP (F, 1, 2) and FL+HSDP (F, 2, 1) with every matrix split over tp = 2, in bf16 and fp32."""
    layouts = {"fl_fsdp": (F, 1, world // (2 * F)), "fl_hsdp": (F, 2, world // (4 * F))}
    return {(strategy, name): _check(rank, strategy, *layout, dtype, T=2)
            for strategy, layout in layouts.items() for name, dtype in DTYPES.items()}


@pytest.mark.parametrize("F,world,worker", [(3, 12, _worker), (8, 16, _worker), (2, 8, _tp_worker)],
                         ids=["F3", "F8", "F2-tp2"])
@pytest.mark.slow
def test_averaging_is_exact(F, world, worker):
    """bf16: identical models stay bit-identical (the fp32 sum of F copies is exact); fp32: within F/2 ulp.
    Different models get the exact mean up to one rounding and fp32 summation error; every group the same."""
    results = run_ranks(worker, world, F)
    for case in results[0]:
        moved, off, same = zip(*(r[case] for r in results))
        if case[1] == "bf16":
            assert max(moved) == 0, f"{case}: averaging identical models changed weights by {max(moved)} ulp"
        # fp32 goes through one fp32 all_reduce: F-1 roundings of partial sums, at most ~half an ulp each.
        assert max(moved) <= max(1, F // 2), f"{case}: averaging identical models moved weights by {max(moved)} ulp"
        assert max(off) <= 1, f"{case}: {max(off):.2f} x the error fp32 accumulation allows"
        assert all(same), f"{case}: groups hold different averages"
