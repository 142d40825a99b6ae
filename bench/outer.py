"""DiLoCo's outer step and the compressed exchange against plain FedAvg, side by side in one run.

F federation groups of S=1 (gloo processes), the `small` preset (~20 MB of fp32 parameters), one model:
rounds rotate plain FedAvg, DiLoCo (fp32 exchange, then the Nesterov outer step), and FedAvg through int8
and bf16 pseudo-gradients, so noise hits all alike. Prints per mode the median time of one aggregation
event and the bytes one rank sent in it, as ratios to plain FedAvg. Targets (issue 15): DiLoCo's event
<= 1.3x FedAvg's time (same bytes); int8 sends <= 0.3x FedAvg's bytes.
Run: python -m bench.outer [--F 2] [--rounds 30] [--preset small] [--offload]
"""
from __future__ import annotations

import argparse
import statistics

from bench.fedavg import timed
from train.contract.spec import RunSpec
from train.federation.outer import DiLoCo, OuterStep
from train.loop import Trainer
from train.runtime.local_ranks import run_ranks

MODES = ("fedavg", "diloco", "fedavg_int8", "fedavg_bf16")


def _worker(rank, world, spec_dict, rounds, offload):
    spec = RunSpec.from_dict(spec_dict)
    trainer = Trainer(spec, rank, "cpu")
    trainer.restore()
    args = (trainer.model, trainer.optimizer, trainer.mesh, spec.layout.A)
    modes = {"fedavg": trainer.fedavg, "diloco": DiLoCo(*args, OuterStep(0.7, 0.9, offload)),
             "fedavg_int8": DiLoCo(*args, OuterStep(1.0, 0.0, offload, "int8")),
             "fedavg_bf16": DiLoCo(*args, OuterStep(1.0, 0.0, offload, "bf16"))}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(rounds):
        for m in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
            times[m].append(timed(modes[m].average))
    return {m: (statistics.median(times[m][1:]), modes[m].event_bytes) for m in MODES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--F", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--offload", action="store_true", help="DiLoCo's state in CPU memory (the same place on CPU)")
    args = ap.parse_args()
    spec = {"strategy": "fl_fsdp", "F": args.F, "R": 1, "S": 1, "A": 1, "out_dir": "/nonexistent",
            "model": {"preset": args.preset}, "train": {"seq_len": 16}}
    outs = run_ranks(_worker, args.F, spec, args.rounds, args.offload)
    worst = {m: max(o[m][0] for o in outs) for m in MODES}  # the slowest rank's median
    sent = {m: max(o[m][1] for o in outs) for m in MODES}
    print(f"model={args.preset} F={args.F} S=1 rounds={args.rounds} (median of each mode's rounds but the first)")
    print(f"{'mode':<12} {'ms/event':>9} {'x FedAvg time':>14} {'MiB sent/rank':>14} {'x FedAvg bytes':>15}")
    for m in MODES:
        print(f"{m:<12} {worst[m] * 1e3:>9.2f} {worst[m] / worst['fedavg']:>14.3f} {sent[m] / 2**20:>14.2f} "
              f"{sent[m] / sent['fedavg']:>15.3f}")
    print("targets: diloco <= 1.3x FedAvg's time; fedavg_int8 <= 0.3x FedAvg's bytes")


if __name__ == "__main__":
    main()
