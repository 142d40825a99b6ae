"""What a tensor-parallel step costs on gloo CPU ranks, against what the step-time model assumes of it.

The step-time model (launcher.placement.steptime) prices a tp = T rank's compute as 1 / T of one rank's whole
data-parallel batch, plus the tensor group's collectives at the probed link's latency and bandwidth. This
measures, at the same global batch, side by side in one run:
- one rank computing half the batch alone (`1 rank, half batch`: what the model takes tp = 2's compute to be),
- FSDP on 2 ranks (S = 2), tp = 2, and tp = 2 with sequence parallelism (2 ranks each),
median step time over `--steps` steps after 5 warm-up steps, the layouts in alternating order over `--repeats`
spawns, and prints each against the half-batch rank and tp = 2 against FSDP.
Run: python -m bench.tensor_parallel [--model tiny] [--seq-len 64] [--batch 4] [--steps 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

WARMUP = 5


def _spec(S: int, tp: int, sequence_parallel: bool, model: str, seq_len: int, batch: int, steps: int) -> dict:
    """`batch`: the global batch; each data-parallel rank gets batch / S sequences."""
    return {"strategy": "fsdp", "F": 1, "R": 1, "S": S, "A": None, "out_dir": "/nonexistent",
            "model": {"preset": model},
            "train": {"steps": WARMUP + steps, "seq_len": seq_len, "batch_per_rank": batch // S, "tp": tp,
                      "sequence_parallel": sequence_parallel, "init": "full"}}


def _median_step(rank: int, world: int, spec_dict: dict) -> float:
    from train.contract.spec import RunSpec
    from train.loop import Trainer

    spec = RunSpec.from_dict(spec_dict)
    trainer = Trainer(spec, rank, "cpu")
    trainer.restore()
    times = []
    for i in range(spec.train.steps):
        start = time.perf_counter()
        trainer.step(i)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    from train.contract.spec import RunSpec
    from train.runtime.local_ranks import run_ranks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    common = (args.model, args.seq_len)
    layouts = {"1 rank, half batch": _spec(1, 1, False, *common, args.batch // 2, args.steps),
               "FSDP, S = 2": _spec(2, 1, False, *common, args.batch, args.steps),
               "tp = 2": _spec(1, 2, False, *common, args.batch, args.steps),
               "tp = 2, sequence-parallel": _spec(1, 2, True, *common, args.batch, args.steps)}
    measured: dict[str, list[float]] = {name: [] for name in layouts}
    for repeat in range(args.repeats):
        for name in list(layouts) if repeat % 2 == 0 else list(reversed(layouts)):
            spec = layouts[name]
            measured[name].append(max(run_ranks(_median_step, RunSpec.from_dict(spec).world_size, spec)))
    step = {name: statistics.median(v) for name, v in measured.items()}
    base = step["1 rank, half batch"]
    print(f"{args.model}, global batch {args.batch} x {args.seq_len} tokens, median of {args.repeats} spawns "
          f"(slowest rank's median over {args.steps} steps)")
    for name, seconds in step.items():
        print(f"  {name:<26} {seconds * 1e3:8.1f} ms   {seconds / base:5.2f}x the half-batch rank")
    print(f"tp = 2 / FSDP: {step['tp = 2'] / step['FSDP, S = 2']:.2f}x; sequence-parallel / tp = 2: "
          f"{step['tp = 2, sequence-parallel'] / step['tp = 2']:.2f}x")


if __name__ == "__main__":
    main()
