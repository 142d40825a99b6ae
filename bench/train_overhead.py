"""Step-time overhead of the fedshard entrypoint over a bare fully_shard loop (same model, same batch).

Both loops run in the same 4 gloo processes, in rounds that alternate which goes first, so machine
noise hits both alike. Ours is the whole Trainer.train() loop (batches, metrics, stop-signal checks);
each round gives seconds per step including warm-up, on both sides. Prints the median over rounds
of each and their ratio (target: <= 1.05).
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
from train.data.sources import build_source, global_batch, rank_rows
from train.loop import Trainer
from train.parallel import mesh as meshes
from train.parallel.dims import Dims
from train.runtime.local_ranks import run_ranks
from train.spec import RunSpec


def _bare(spec: RunSpec, ids: torch.Tensor, steps: int) -> float:
    """Seconds per step of the plainest FSDP2 loop: forward, backward, optimizer step."""
    torch.manual_seed(spec.train.seed)
    model = models.build(models.llama_config(spec.model), "cpu")
    shard_mesh = meshes.build("cpu", Dims(1, 1, spec.S))["shard"]
    for layer in model.model.layers:  # the plainest wrapping: each layer, then the rest in the root
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
    ids = source.train_batch(0, rank_rows(spec, spec.dims.data_rank(rank)), global_batch(spec), spec.train.seq_len)
    bare, ours = [], []
    for i in range(rounds):  # alternate which side runs first, so drift in the machine favours neither
        pair = [(bare, lambda: _bare(spec, ids, steps)), (ours, lambda: _ours(spec, rank, steps))]
        for times, fn in pair[::1 if i % 2 else -1]:
            times.append(fn())
    return statistics.median(bare), statistics.median(ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", default="small")
    args = ap.parse_args()
    spec = {"strategy": "fsdp", "F": 1, "R": 1, "S": 4, "out_dir": "/nonexistent", "model": {"preset": args.preset},
            "train": {"steps": args.steps, "seq_len": 128, "batch_per_rank": 2, "log_every": 10}}
    bare, ours = max(run_ranks(_worker, 4, spec, args.steps, args.rounds), key=lambda x: x[1])
    print(f"model={args.preset} ranks=4 (fsdp) steps={args.steps}x{args.rounds}")
    print(f"bare fully_shard loop   step {bare * 1e3:8.2f} ms (median over rounds)")
    print(f"fedshard Trainer.train  step {ours * 1e3:8.2f} ms (median over rounds)")
    print(f"overhead ratio          {ours / bare:8.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
