"""FedAvg across the fed dimension, in place on the local shards.

Every A optimizer steps each rank averages its parameter shards with the same
shard in the other F-1 groups: the shards are packed into flat buffers (chunked,
so an 8B model never needs a second full copy), all_reduce SUM over the fed group,
divided by F while being copied back into the shard storage (gloo has no
AVG/PREMUL_SUM). FL+HSDP: only replica 0 of each group reduces across groups,
then broadcasts the sum over its replicate group, so replicas stay bit-identical.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from . import alignment
from .parallelize import local

CHUNK_BYTES = 256 * 2**20


class FedAvg:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, mesh: DeviceMesh, A: int,
                 average_optimizer_state: bool = False, chunk_bytes: int = CHUNK_BYTES):
        self.model, self.optimizer, self.A = model, optimizer, A
        self.average_optimizer_state = average_optimizer_state
        self.chunk_bytes = chunk_bytes
        self.F = mesh["fed"].size()
        self.fed_group = mesh.get_group("fed")
        self.rep_group = mesh.get_group("replicate")
        self.replica = mesh["replicate"].get_local_rank()
        self.replicated = mesh["replicate"].size() > 1
        self.device = mesh.device_type
        self.checked = False
        self.buffer: torch.Tensor | None = None

    def due(self, steps_done: int) -> bool:
        """Whether to average after `steps_done` optimizer steps."""
        return steps_done % self.A == 0

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def check_alignment(self, contents: bool) -> None:
        """Run the guard; `contents` also compares initial weights (only meaningful before training diverges)."""
        alignment.check(self.named_params(), self.fed_group, self.device, contents)
        self.checked = True

    def tensors(self) -> list[torch.Tensor]:
        """Local storage views to average, in a fixed order shared by all groups."""
        out = [local(p) for _, p in self.named_params()]
        if self.average_optimizer_state:
            for _, p in self.named_params():
                state = self.optimizer.state.get(p, {})
                out += [local(state[k]) for k in ("exp_avg", "exp_avg_sq") if k in state]
        return out

    def average(self) -> None:
        if not self.checked:
            self.check_alignment(contents=False)
        with torch.no_grad():
            for chunk in self._chunks(self.tensors()):
                flat = self._buffer(chunk)
                torch.cat([t.reshape(-1) for t in chunk], out=flat)
                if self.replica == 0:
                    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.fed_group)
                if self.replicated:
                    dist.broadcast(flat, group=self.rep_group, group_src=0)
                for t, total in zip(chunk, flat.split([t.numel() for t in chunk])):
                    torch.div(total.view_as(t), self.F, out=t)  # divide while copying back: one pass

    def _buffer(self, chunk: list[torch.Tensor]) -> torch.Tensor:
        """One flat buffer kept between averagings: a fresh allocation per event costs page faults."""
        numel = sum(t.numel() for t in chunk)
        if self.buffer is None or self.buffer.numel() < numel or self.buffer.dtype != chunk[0].dtype:
            self.buffer = torch.empty(numel, dtype=chunk[0].dtype, device=chunk[0].device)
        return self.buffer[:numel]

    def _chunks(self, tensors: list[torch.Tensor]):
        """Consecutive runs of same-dtype tensors up to chunk_bytes each."""
        chunk: list[torch.Tensor] = []
        size = 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            if chunk and (size + nbytes > self.chunk_bytes or t.dtype != chunk[0].dtype):
                yield chunk
                chunk, size = [], 0
            chunk.append(t)
            size += nbytes
        if chunk:
            yield chunk
