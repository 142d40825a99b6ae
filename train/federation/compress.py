"""Compressed exchange of what crosses the federation links (train.aggregation_dtype = bf16 or int8; the
pseudo-gradients of train.outer travel, not the parameters).

gloo has no int8 (or fp32-accumulating bf16) sum, and a sum in a narrow type loses the small terms, so
nothing is ever added on the wire: as torchft does, `mean_over` sends piece j of every rank's encoded
buffer to rank j (all_to_all), which decodes the F pieces, adds them in fp32 and divides by F, encodes its
averaged piece once more and all_gathers it. Each rank sends 2 (F - 1) / F of the encoded buffer, the
volume of a ring all_reduce, in 2 or 1 byte per value (int8 adds one fp32 scale per BLOCK values).

int8 is symmetric per block of BLOCK consecutive values: scale = max |x| / 127, so each value is off by at
most scale / 2 per encoding, and it is encoded twice (before and after the average).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from train.contract.spec import INT8_BLOCK
from train.federation.inflight import Exchange, launched

# torch >= 2.10 renamed all_gather_into_tensor; the package supports torch from 2.6.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
BLOCK = INT8_BLOCK  # values sharing one int8 scale: 1 + 4/64 bytes per value, 0.27x fp32's


def padded(numel: int, F: int) -> int:
    """A length every piece of which holds whole int8 blocks."""
    unit = F * BLOCK
    return -(-numel // unit) * unit


def encode(x: torch.Tensor, dtype: str) -> list[torch.Tensor]:
    """The tensors that travel for the fp32 values `x` (length a multiple of BLOCK)."""
    if dtype == "bf16":
        return [x.to(torch.bfloat16)]
    blocks = x.view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1).div_(127.0)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = blocks.div(safe[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return [q.view(-1), scale]


def decode(payload: list[torch.Tensor], dtype: str) -> torch.Tensor:
    if dtype == "bf16":
        return payload[0].float()
    q, scale = payload
    return (q.view(-1, BLOCK).float() * scale[:, None]).view(-1)


def mean_over(x: torch.Tensor, F: int, group, dtype: str) -> Exchange:
    """An exchange (train.federation.inflight) whose value is (the mean of `x` over the F ranks of `group`, in fp32; the
    bytes this rank sent). `x`: fp32, its length a multiple of F * BLOCK (`padded`)."""
    return (yield from summed(x, F, dtype, over(group), divisor=F))


def over(group) -> Collectives:
    """The collectives of a torch.distributed process group, launched asynchronously."""
    return Collectives(lambda out, inp: dist.all_to_all_single(out, inp, group=group, async_op=True),
                       lambda out, inp: all_gather(out, inp, group=group, async_op=True))


@dataclass(frozen=True)
class Collectives:
    """The two collectives an encoded exchange runs, each launched asynchronously and returning its Work: a process
    group's (`over`), or a torchft quorum's (train.federation.groups), whose members change between rounds."""
    all_to_all: Callable[[torch.Tensor, torch.Tensor], dist.Work]  # (output, input), equal pieces
    all_gather: Callable[[torch.Tensor, torch.Tensor], dist.Work]  # (output, input) into one tensor


def summed(x: torch.Tensor, F: int, dtype: str, via: Collectives, divisor: float = 1) -> Exchange:
    """An exchange whose value is (the sum of `x` over the F ranks `via` reaches, added in fp32 and divided by
    `divisor`; the bytes this rank sent). `x`: fp32, its length a multiple of F * BLOCK (`padded`)."""
    sent = encode(x, dtype)
    received = [torch.empty_like(t) for t in sent]
    yield from launched(lambda: [via.all_to_all(out, inp) for out, inp in zip(received, sent)])
    mine = decode(received, dtype).view(F, -1).sum(dim=0)
    if divisor != 1:
        mine.div_(divisor)
    back = encode(mine, dtype)
    gathered = [t.new_empty(F * t.numel()) for t in back]
    yield from launched(lambda: [via.all_gather(out, inp) for out, inp in zip(gathered, back)])
    nbytes = sum(t.numel() * t.element_size() for t in sent) * (F - 1) // F \
        + sum(t.numel() * t.element_size() for t in back) * (F - 1)
    return decode(gathered, dtype), nbytes
