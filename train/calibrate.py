"""Compute calibration for the step-time model: one rank's forward, backward and AdamW step at a run's batch.

Every rank of the probe job measures at once, as training computes (ranks sharing a node's CPUs or memory
bandwidth slow each other as they do in a step). Models with 1 and 2 decoder layers are timed, so the root
(embeddings, lm_head) and one layer separate and a model of any depth is priced without building it whole
(Llama-3.1-8B's two-layer slice has 1.5 B parameters, ~24 GB with fp32 AdamW state, against 8 B).
16-bit precisions compute in bf16 over fp32 weights ("paper": bf16 weights too), as train.parallelize does.
"""
from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.distributed as dist

from . import model as models

PHASES = ("forward_s", "backward_s", "optimizer_s")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time_one(llama_kwargs: dict, layers: int, batch: int, seq_len: int, precision: str, device: str,
              iters: int) -> list[float]:
    """Median forward, backward and optimizer seconds of a `layers`-layer model over `iters` steps."""
    # a copy: LlamaConfig edits nested dicts (rope_scaling) in place, and the workload must stay as the plan sent it
    config = models.llama_config({**copy.deepcopy(llama_kwargs), "num_hidden_layers": layers})
    torch.manual_seed(0)
    model = models.build(config, device)
    if precision == "paper":
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len), device=device)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "bf16")
    samples = []
    for i in range(iters + 1):  # the first step allocates AdamW's state and warms kernels: not counted
        dist.barrier()
        start = time.perf_counter()
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        _sync(device)
        forward = time.perf_counter()
        loss.backward()
        _sync(device)
        backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        done = time.perf_counter()
        if i:
            samples.append((forward - start, backward - forward, done - backward))
    return [statistics.median(s[k] for s in samples) for k in range(3)]


def calibrate(rank: int, workloads: list[dict], device: str = "cpu", iters: int = 3, progress=None) -> list[dict]:
    """[{**workload, "root": {phase: s}, "layer": {phase: s}}] for workloads {model, batch_per_rank, seq_len,
    precision}: the slowest rank's medians; every rank must call it with the same workloads."""
    out = []
    for w in workloads:
        one, two = (_time_one(w["model"], layers, w["batch_per_rank"], w["seq_len"], w["precision"], device,
                              iters) for layers in (1, 2))
        slowest = torch.tensor(one + two, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        one, two = slowest[:3].tolist(), slowest[3:].tolist()
        layer = [max(b - a, 0.0) for a, b in zip(one, two)]
        out.append({**w, "root": dict(zip(PHASES, (max(a - lay, 0.0) for a, lay in zip(one, layer)))),
                    "layer": dict(zip(PHASES, layer))})
        if progress is not None and rank == 0:
            progress(f"probe: compute of {w['model'].get('num_hidden_layers')}-layer model at "
                     f"{w['batch_per_rank']}x{w['seq_len']} tokens ({w['precision']}) done")
    return out
