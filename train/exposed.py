"""Exposed communication, measured: the time a step spends on communication that compute did not hide.

After training (timed apart, like an evaluation), each rank runs a few more steps of the same model on the same
batches with no collective in them: every FSDP module keeps its parameters gathered (one all-gather before the
first of them), gradient sync is off, and the optimizer's local update runs on zero gradients. The step time
measured during training less that compute-only time is the exposed communication (and waiting) per step; the
FedAvg exchanges, averaged per step, are part of it. Tensor- and pipeline-parallel layouts are not measured: their
collectives run inside the layers' forward and backward and cannot be switched off.
"""
from __future__ import annotations

import time

import torch
from torch.distributed.fsdp import FSDPModule

from .launch_env import sync_device

NOT_MEASURED = "not measured: {}"
METHOD = ("compute-only steps after training: FSDP parameters kept gathered, gradient sync off, no collective; "
          "max over ranks")


def why_not(tp: int, pp: int, steps: int) -> str | None:
    """Why this layout's exposed communication cannot be measured, or None when it can."""
    if steps == 0:
        return NOT_MEASURED.format("train.compute_only_steps=0")
    if tp > 1 or pp > 1:
        return NOT_MEASURED.format(f"tp={tp}, pp={pp}: tensor- and pipeline-parallel collectives run inside the "
                                   "layers and cannot be switched off")
    return None


def gather(model: torch.nn.Module) -> None:
    """All-gather every FSDP module's parameters once and keep them gathered, with gradient sync off: from here on
    a forward and backward call no collective. The model is no longer fit for training: call it after the run."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(False, recurse=False)
            module.set_reshard_after_backward(False, recurse=False)
            module.set_requires_gradient_sync(False, recurse=False)
            module.unshard()


def compute_only_s(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches, device: str) -> float:
    """Mean seconds of one step (forward, backward, optimizer update) of a `gather`ed model, over `batches` after a
    warm-up on the first. Changes the optimizer state: call it after the run."""
    for group in optimizer.param_groups:  # with sync off the sharded parameters get no gradient: zeros stand in
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    times = []
    for ids in batches:
        sync_device(device)
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        sync_device(device)
        times.append(time.perf_counter() - start)
    timed = times[1:] or times
    for module in model.modules():  # the gathered parameters are freed again
        if isinstance(module, FSDPModule):
            module.reshard()
    return sum(timed) / len(timed)
