"""Non-finite values stop a run before they spread (train.on_nonfinite).

A NaN or inf in one rank's loss or gradient poisons its group's parameters at the next optimizer step; the next
FedAvg would hand them to every group (an int8 exchange turns one inf into a block of NaN) and a checkpoint would
keep them. Each rank notes, on its device and without synchronising, the first step and tensor that went
non-finite; the ranks compare notes where the world talks anyway or values leave the run: a step that logs, a
checkpoint, an evaluation and the final average. An outer step does not ask: it averages only what is finite
(train.federation.federated), so nothing non-finite crosses groups before the next comparison stops the run.
`stop` raises the same one-line NonFiniteError on every rank there; `skip_step` agrees after every backward
instead, within the federation group (the ranks holding one model: other groups need not wait), and every rank of
it drops that step's update: one host read per step, by choice.
The notes cost a handful of kernels per step (one fused max-abs over every gradient) and no host transfer.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from train.contract.common import NonFiniteError
from train.contract.layout import Layout


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class Guard:
    """One rank's watch over its loss and gradient shards."""

    def __init__(self, model: torch.nn.Module, mode: str, rank: int, layout: Layout, device: str, mesh: DeviceMesh):
        self.names, self.params = zip(*model.named_parameters())
        self.mode, self.rank, self.layout, self.device = mode, rank, layout, device
        # skip_step agrees within the federation group: the ranks at this rank's federation coordinate
        self.group = mesh[tuple(mesh.mesh_dim_names[1:])]._flatten().get_group() if mode == "skip_step" else None
        self.zero = torch.zeros((), device=device)
        # (steps done at the first non-finite value, 0: none yet; 0: the loss | i + 1: parameter i's gradient)
        self.first = torch.zeros(2, dtype=torch.int64, device=device)
        self.pending = False  # stop: steps noted since the ranks last compared (every rank steps alike, so all
                              # agree whether to compare: a FedAvg, checkpoint and evaluation at one step cost one)

    def _flags(self, loss: torch.Tensor) -> torch.Tensor:
        """Non-finite?, for the loss and then each parameter's local gradient shard: the largest magnitude of
        each, in one fused kernel, is finite exactly when all its values are (an empty shard has none)."""
        grads = [None if p.grad is None else _local(p.grad) for p in self.params]
        present = [g for g in grads if g is not None and g.numel()]
        peaks = iter(torch._foreach_norm(present, math.inf) if present else [])
        values = [loss.detach()] + [next(peaks) if g is not None and g.numel() else self.zero for g in grads]
        return ~torch.isfinite(torch.stack([v.float() for v in values]))

    def after_backward(self, step: int, loss: torch.Tensor) -> bool:
        """Note step `step`'s loss and gradients (0-based step); True when this step's update is to be dropped
        (skip_step, agreed by every rank)."""
        flags = self._flags(loss)
        if self.mode == "skip_step":
            bad = flags.any().to(torch.int64)
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.group)
            return bool(bad.item())
        new = flags.any() & (self.first[0] == 0)  # only the first one counts: the rest follow from it
        where = torch.stack([torch.full((), step + 1, dtype=torch.int64, device=self.device),
                             flags.to(torch.int64).argmax()])
        self.first = torch.where(new, where, self.first)
        self.pending = True
        return False

    def check(self, before: str) -> None:
        """Collective: raise NonFiniteError on every rank if any rank has noted a non-finite value since the
        ranks last compared (nothing to compare when no step ran since)."""
        if not self.pending:
            return
        self.pending = False
        notes = [torch.empty_like(self.first) for _ in range(dist.get_world_size())]
        dist.all_gather(notes, self.first)
        hits = [(int(step), rank, int(which)) for rank, (step, which) in enumerate(n.tolist() for n in notes)
                if step > 0]
        if not hits:
            return
        step, rank, which = min(hits)
        tensor = "the loss" if which == 0 else f"the gradient of {self.names[which - 1]}"
        group = self.layout.coords(rank)[0]
        raise NonFiniteError(f"{tensor} was not finite at step {step} on rank {rank} (federation group {group}); "
                             f"the run stopped before {before}, so nothing non-finite was averaged or saved "
                             f"(train.on_nonfinite=skip_step drops such steps instead)")
