"""FedAvg time against one flat all_reduce of the same number of bytes over the same fed group.

F federation groups of S=1 (F=2: one gloo process per core on a 2-core machine; F=4: two per core),
the `small` preset (~20 MB of fp32 parameters); rounds alternate the order of the two so noise hits
both alike. Prints medians and the ratio per F (target <= 1.2). With --precision paper the parameters are
bf16: FedAvg then sums in fp32 (all_to_all, local sum, all_gather) and the baseline is a bf16 all_reduce,
which moves the same bytes but adds in bf16 (the inexact average FedAvg replaced).
Run: python -m bench.fedavg [--F 2,4] [--rounds 40] [--preset small] [--precision fp32|paper]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from train.contract.spec import RunSpec
from train.federation.federated import FedAvg
from train.loop import Trainer
from train.runtime.local_ranks import run_ranks


def timed(fn) -> float:
    """Seconds of fn() on every rank between two barriers."""
    dist.barrier()
    t = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t


def _worker(rank, world, spec_dict, rounds):
    spec = RunSpec.from_dict(spec_dict)
    trainer = Trainer(spec, rank, "cpu")
    trainer.restore()
    fedavg: FedAvg = trainer.fedavg
    tensors = fedavg.tensors()
    numel = sum(t.numel() for t in tensors)
    flat = torch.zeros(numel, dtype=tensors[0].dtype)  # the baseline moves the same bytes in the same dtype
    ours, base = [], []
    for i in range(rounds):
        pair = [(ours, fedavg.average), (base, lambda: dist.all_reduce(flat, group=fedavg.fed_group))]
        for times, fn in pair[::1 if i % 2 else -1]:
            times.append(timed(fn))
    return numel * flat.element_size(), statistics.median(ours[1:]), statistics.median(base[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--F", default="2,4", help="comma-separated numbers of federation groups")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "paper"),
                    help="paper: bf16 parameters (all_to_all + fp32 sum + all_gather vs a bf16 all_reduce)")
    args = ap.parse_args()
    print(f"model={args.preset} precision={args.precision} S=1 rounds={args.rounds}")
    print(f"{'F':>3} {'MiB/rank':>9} {'all_reduce ms':>14} {'FedAvg ms':>10} {'ratio':>6}  (target <= 1.2)")
    for F in map(int, args.F.split(",")):
        spec = {"strategy": "fl_fsdp", "F": F, "R": 1, "S": 1, "A": 1, "out_dir": "/nonexistent",
                "model": {"preset": args.preset}, "train": {"seq_len": 16, "precision": args.precision}}
        nbytes, ours, base = max(run_ranks(_worker, F, spec, args.rounds), key=lambda x: x[1])
        print(f"{F:>3} {nbytes / 2**20:>9.1f} {base * 1e3:>14.2f} {ours * 1e3:>10.2f} {ours / base:>6.3f}")

if __name__ == "__main__":
    main()
