"""Compressed exchange (train.federation.compress): encodings within their stated error, the mean over real gloo ranks
within the bound the module states, and the bytes that travel."""
import torch
import torch.distributed as dist

from tests.support import run_ranks
from train.federation import compress, inflight

F, N = 4, 8 * compress.BLOCK * 4


def _data(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(N, generator=g) * torch.logspace(-6, 0, N // compress.BLOCK).repeat_interleave(compress.BLOCK)
    x[:compress.BLOCK] = 0.0  # an all-zero block: no scale to divide by
    return x


def test_int8_encoding_is_within_half_a_step_of_its_block_scale():
    x = _data(0)
    q, scale = compress.encode(x, "int8")
    assert q.dtype == torch.int8 and scale.numel() == N // compress.BLOCK
    err = (compress.decode([q, scale], "int8") - x).abs().view(-1, compress.BLOCK)
    assert bool((err <= scale[:, None] / 2 * (1 + 1e-6)).all())
    assert bool((compress.decode([q, scale], "int8")[:compress.BLOCK] == 0).all())
    b = compress.decode(compress.encode(x, "bf16"), "bf16")
    assert bool(((b - x).abs() <= x.abs() * 2 ** -8).all())  # bf16: 8 significant bits, rounded to nearest


def _mean(rank, world, dtype):
    out, sent = inflight.run(compress.mean_over(_data(rank), world, dist.group.WORLD, dtype))
    return out, sent


def test_mean_over_ranks_is_within_the_stated_bound_and_sends_what_it_says():
    exact = sum(_data(r) for r in range(F)) / F
    largest = torch.stack([_data(r).abs() for r in range(F)]).amax(0)
    fp32_ring = 2 * N * 4 * (F - 1) // F  # what an fp32 all_reduce sends per rank
    for dtype in ("bf16", "int8"):
        outs = run_ranks(_mean, F, dtype)
        assert all(torch.equal(outs[0][0], o[0]) for o in outs)  # every rank holds the same mean
        got, sent = outs[0]
        if dtype == "bf16":
            # rounded twice, each time within 2^-8 of the value: the senders' values, then their mean
            assert bool(((got - exact).abs() <= 2 ** -7 * (1 + 2 ** -7) * largest).all())
            assert sent == 2 * N * 2 * (F - 1) // F
        else:
            # half the senders' largest block scale, then half the scale of the mean it re-encodes, whose
            # block maximum is off by at most that first error: first / 2 + (exact's scale + first / 254) / 2
            first = torch.stack([compress.encode(_data(r), "int8")[1] for r in range(F)]).amax(0)
            bound = (first / 2 + compress.encode(exact, "int8")[1] / 2 + first / 508).repeat_interleave(compress.BLOCK)
            assert bool(((got - exact).abs() <= bound * (1 + 1e-5)).all())
            assert sent == 2 * (N + N // compress.BLOCK * 4) * (F - 1) // F
            assert sent <= 0.3 * fp32_ring, f"int8 sends {sent / fp32_ring:.3f}x the bytes of fp32"
