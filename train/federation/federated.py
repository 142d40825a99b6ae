"""FedAvg across the fed dimension, in place on the local shards.

Every A optimizer steps each rank averages its parameter shards with the same
shard in the other F-1 groups. The shards are packed into flat buffers (chunked,
so an 8B model never needs a second full copy); the sum always accumulates in fp32:

- fp32 tensors: all_reduce SUM over the fed group, divided by F before being copied
  back (gloo has no AVG/PREMUL_SUM);
- bf16 (16-bit) tensors travel as bf16 but are never added in bf16 (a bf16 ring sum of
  128 models changes nearly every weight by ~6 % RMS): all_to_all sends piece j of
  every group's buffer to group j, which sums the F copies in fp32, divides by F and
  rounds once to bf16; an all_gather returns the averaged pieces. That sends 2(F-1)/F
  of the buffer per rank, the bytes of a bf16 ring all_reduce, and averaging F
  identical models changes no bit (F copies of an 8-bit significand sum exactly in
  fp32's 24 bits for F <= 65536). Every group receives the same rounding.

Nothing non-finite crosses groups, and no rank asks the others before an average: a chunk whose average is not
finite (some group's values went NaN or inf) is not written back, each group keeps its own, and the ranks'
next comparison of their non-finite notes (train.runtime.nonfinite: at a log, checkpoint or evaluation) stops
the run. The exchange is the only collective an averaging step issues beyond the step's own.

FL+HSDP: every replica of a group averages its own 1/R of the buffer across the groups (over its fed group,
the ranks at the same replica and shard in every group), then an all_gather over the replicate group puts the
pieces together, so replicas stay bit-identical: each rank sends 1/R of the cross-group traffic, none idles, and
the replicate group carries (R - 1)/R of the buffer instead of a broadcast of all of it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from train.contract.spec import FEDAVG_CHUNK_BYTES
from train.federation import alignment
from train.federation.compress import all_gather
from train.federation.inflight import ExchangeClock
from train.parallel.parallelize import local

SUM_BLOCK = 1 << 18  # values of a 16-bit piece summed at a time: 1 MiB of fp32 accumulator


class FedAvg:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, mesh: DeviceMesh, A: int,
                 average_optimizer_state: bool = False, chunk_bytes: int = FEDAVG_CHUNK_BYTES):
        self.model, self.optimizer, self.A = model, optimizer, A
        self.average_optimizer_state = average_optimizer_state
        self.chunk_bytes = chunk_bytes
        self.F = mesh["fed"].size()
        self.fed_group = mesh.get_group("fed")
        self.rep_group = mesh.get_group("replicate")
        self.replica, self.R = mesh["replicate"].get_local_rank(), mesh["replicate"].size()
        self.device = mesh.device_type
        self.checked = False
        self.buffer: torch.Tensor | None = None
        self.total: torch.Tensor | None = None  # 16-bit parameters: the fp32 sum of a block of this rank's piece
        self.event_bytes = 0  # what this rank sent over the federation links in the last average
        self.clock = ExchangeClock(self.device)

    @property
    def exchange_s(self) -> float:
        """Seconds spent exchanging in all, hidden behind training or not, timed where it ran (read after
        training: on GPU it waits for the device)."""
        return self.clock.seconds()

    def due(self, steps_done: int) -> bool:
        """Whether to average after `steps_done` optimizer steps."""
        return steps_done % self.A == 0

    def after_step(self, steps_done: int) -> bool:
        """Average when due; whether this step aggregated (train.federation.outer streams instead)."""
        if not self.due(steps_done):
            return False
        self.average()
        return True

    def in_sync_after(self, steps_done: int) -> bool:
        """Whether every group holds the same parameters after `steps_done` steps (else the run ends with a
        final average)."""
        return self.due(steps_done)

    def flush(self) -> None:
        """Nothing is ever in flight between two steps of plain FedAvg (train.federation.outer streams)."""

    def named_params(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def guarded(self) -> list[tuple[str, torch.Tensor]]:
        """What the alignment guard compares across groups: the parameters (and, in DiLoCo, the outer state)."""
        return self.named_params()

    def outer_state(self) -> dict:
        """State beyond the model and optimizer that checkpoints keep: none for FedAvg (train.federation.outer)."""
        return {}

    def device_state(self) -> list:
        """Tensors kept on the device between averages, beyond the model and optimizer: none
        (train.federation.outer)."""
        return []

    def check_alignment(self, contents: bool) -> None:
        """Run the guard; `contents` also compares initial weights (only meaningful before training diverges)."""
        alignment.check(self.guarded(), self.fed_group, self.device, contents)
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
        self.event_bytes, start = 0, self.clock.mark()
        with torch.no_grad():
            for chunk in self._chunks(self.tensors()):
                sizes = [t.numel() for t in chunk]
                summed = chunk[0].element_size() >= 4  # fp32: flat holds the sum, divided while copied back
                flat, piece, received = self._buffers(chunk[0], sum(sizes), receive=not summed)
                torch.cat([t.reshape(-1) for t in chunk], out=flat[:sum(sizes)])
                if self.R > 1:  # this replica's share of the buffer (module docstring)
                    piece.copy_(flat.view(self.R, -1)[self.replica])
                self._reduce_across_groups(piece, received, summed)
                # a ring all_reduce, or all_to_all + all_gather: 2 (F - 1) / F of the piece each
                self.event_bytes += 2 * piece.numel() * piece.element_size() * (self.F - 1) // self.F
                if self.R > 1:
                    all_gather(flat, piece, group=self.rep_group)
                # A group whose values went non-finite (train.runtime.nonfinite) would spread them: every group
                # keeps its own chunk instead, decided on the device, and the next comparison stops the run.
                finite = torch.isfinite(flat[:sum(sizes)]).all()
                for t, value in zip(chunk, flat[:sum(sizes)].split(sizes)):
                    value = value.view_as(t)
                    if summed:
                        value.div_(self.F)
                    t.copy_(torch.where(finite, value, t))
        self.clock.span(start, self.clock.mark())

    def _reduce_across_groups(self, flat: torch.Tensor, received: torch.Tensor | None, summed: bool) -> None:
        """flat <- its sum over the fed group (fp32) or its mean, summed in fp32 (16-bit; module docstring)."""
        if summed:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.fed_group)
            return
        dist.all_to_all_single(received, flat, group=self.fed_group)
        pieces = received.view(self.F, -1)
        mine = pieces[0]  # received is no longer needed: it takes the mean, rounded once to 16 bits
        # one reduction over the F pieces per block: on a GPU the whole piece at once (a launch per chunk, not per
        # group and block); on a CPU blocks that stay in cache through its passes
        block = mine.numel() if self.device == "cuda" else SUM_BLOCK
        for start in range(0, mine.numel(), block):
            end = min(start + block, mine.numel())
            total = torch.sum(pieces[:, start:end], dim=0, dtype=torch.float32, out=self._accumulator(end - start))
            mine[start:end].copy_(total.div_(self.F))
        all_gather(flat, mine, group=self.fed_group)

    def _buffers(self, like: torch.Tensor, used: int,
                 receive: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The flat buffer, this replica's piece of it (the buffer itself when R = 1) and, for the all_to_all, a
        receive buffer of the piece's size; padded to a multiple of F x R and kept between averagings (a fresh
        allocation per event costs page faults). The padding is zeroed so it averages to zero. The fp32
        all_reduce needs no receive buffer, so none is allocated for it."""
        numel = -(-used // (self.F * self.R)) * self.F * self.R
        part = numel // self.R
        width = numel + (part if self.R > 1 else 0) + (part if receive else 0)
        if self.buffer is None or self.buffer.numel() < width or self.buffer.dtype != like.dtype:
            self.buffer = torch.empty(width, dtype=like.dtype, device=like.device)
        flat = self.buffer[:numel]
        flat[used:].zero_()
        piece = self.buffer[numel:numel + part] if self.R > 1 else flat
        return flat, piece, self.buffer[width - part:width] if receive else None

    def _accumulator(self, numel: int) -> torch.Tensor:
        """The fp32 sum of a block of this rank's piece, kept between averagings like the buffers."""
        if self.total is None or self.total.numel() < numel:
            self.total = torch.empty(numel, dtype=torch.float32, device=self.device)
        return self.total[:numel]

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
