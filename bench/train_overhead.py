"""Step-time overhead of the fedshard entrypoint over a bare fully_shard loop (same model, same batch).

The loops run in the same 4 gloo processes, in rounds that rotate which goes first, so machine noise hits
them alike. Ours is the whole Trainer.train() loop (batches, metrics, stop-signal checks); the bare loops shard
the model with fedshard's units (train.parallel.parallelize.shard: torchtitan's, the like-for-like baseline the
target is on) and with the plainest wrapping (each layer, then everything else in the root: what fedshard did
before 2026-12-05, so the line beside it shows what torchtitan's units cost on CPU, where nothing overlaps);
each round gives seconds per step including warm-up. Prints the median over rounds of each and the ratios
(target: <= 1.05 against the like-for-like loop).
Run: python -m bench.train_overhead [--steps 30] [--rounds 5] [--preset small]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from train import model as models
from train import optim
from train.contract.layout import Layout
from train.contract.spec import RunSpec
from train.data.sources import build_source, global_batch, rank_rows
from train.loop import Trainer
from train.parallel import mesh as meshes
from train.parallel import parallelize
from train.runtime.local_ranks import run_ranks


def _bare(spec: RunSpec, ids: torch.Tensor, steps: int, units: str) -> float:
    """Seconds per step of the plainest FSDP2 loop: forward, backward, optimizer step; `units`: "fedshard"
    (parallelize.shard) or "plain" (each layer, then the root)."""
    torch.manual_seed(spec.train.seed)
    model = models.build(models.llama_config(spec.model), "cpu")
    shard_mesh = meshes.build("cpu", Layout("fsdp", 1, 1, spec.layout.S))["shard"]
    if units == "fedshard":
        parallelize.shard(model, shard_mesh, "fp32", "fp32")
    else:
        for layer in model.model.layers:
            fully_shard(layer, mesh=shard_mesh)
        fully_shard(model, mesh=shard_mesh)
    opt = optim.adamw(model.parameters(), spec.train)
    dist.barrier()
    t = time.perf_counter()
    for _ in range(steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    return (time.perf_counter() - t) / steps


def _ours(spec: RunSpec, rank: int, steps: int) -> float:
    """Seconds per step of Trainer.train(): the real loop, with its data, metrics and stop-signal checks."""
    return Trainer(spec, rank, "cpu").train() / steps


def _worker(rank, world, spec_dict, steps, rounds):
    spec = RunSpec.from_dict(spec_dict)
    source = build_source(spec.data, models.llama_config(spec.model).vocab_size, spec.train.seq_len, spec.train.seed)
    ids = source.train_batch(0, rank_rows(spec, spec.layout.data_rank(rank)), global_batch(spec), spec.train.seq_len)
    bare, plain, ours = [], [], []
    loops = [(bare, lambda: _bare(spec, ids, steps, "fedshard")), (plain, lambda: _bare(spec, ids, steps, "plain")),
             (ours, lambda: _ours(spec, rank, steps))]
    for i in range(rounds):  # rotate which loop runs first, so drift in the machine favours none
        for times, fn in loops[i % 3:] + loops[:i % 3]:
            times.append(fn())
    return statistics.median(bare), statistics.median(plain), statistics.median(ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", default="small")
    args = ap.parse_args()
    spec = {"strategy": "fsdp", "F": 1, "R": 1, "S": 4, "out_dir": "/nonexistent", "model": {"preset": args.preset},
            "train": {"steps": args.steps, "seq_len": 128, "batch_per_rank": 2, "log_every": 10}}
    bare, plain, ours = max(run_ranks(_worker, 4, spec, args.steps, args.rounds), key=lambda x: x[2])
    print(f"model={args.preset} ranks=4 (fsdp) steps={args.steps}x{args.rounds}")
    print(f"bare loop, fedshard's units    step {bare * 1e3:8.2f} ms (median over rounds)")
    print(f"bare loop, layers + root       step {plain * 1e3:8.2f} ms (median over rounds)")
    print(f"fedshard Trainer.train         step {ours * 1e3:8.2f} ms (median over rounds)")
    print(f"overhead ratio                 {ours / bare:8.3f}  (target <= 1.05)")
    print(f"torchtitan's units on CPU      {bare / plain:8.3f}  (bare loops, fedshard's units over layers + root)")


if __name__ == "__main__":
    main()
