"""What a lost federation group costs, side by side on cluster=local (issue 56): fault-tolerant groups
(train.fault_tolerance=groups: the others go on, the lost group heals from a peer) against today's path (the job
fails, `retries=1` resumes every group from the last checkpoint), on the same fault, step and seeds.

Four launcher commands, each sweep.repeats seeds of the smoke sweep's FL+FSDP run on `tiny` (A = 8, one group per
node of 2 ranks):
fault-free and killed, with and without fault tolerance; group 1 is killed after --fault-step. Per seed it prints the
training time, the time lost to the fault (training time over the fault-free run's of the same path and seed, plus
the seconds from the fault to the resume where the run was resumed), the tokens lost or trained again, and the final
eval loss (ln eval_ppl) against the fault-free run's. Run: python -m bench.fault_tolerance [--nodes 2] [--steps 80]
[--fault-step 30] [--checkpoint-every 16] [--repeats 3] [--out DIR] [KEY=VALUE ...] (more launcher overrides, e.g.
train=learn)
"""
from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from train.contract.result import RunResult

ROOT = Path(__file__).resolve().parent.parent


def sweep(out: Path, name: str, args, *overrides: str) -> list[RunResult]:
    """One launcher command; the results of its repeats, in repeat order."""
    results_dir, run = out / name, f"fl_fsdp-F{args.nodes}-R1-S2-A8"
    cmd = [sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "sweep.strategies=[fl_fsdp]", "sweep.A=[8]",
           f"sweep.nodes=[{args.nodes}]", f"sweep.train.steps={args.steps}", f"sweep.repeats={args.repeats}",
           f"results_dir={results_dir}", *args.overrides, *overrides]
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    runs = results_dir / "local" / "smoke"
    return [RunResult.load(runs / (run if k == 1 else f"{run}-rep{k}") / "result.json")
            for k in range(1, args.repeats + 1)]


def lost_s(killed: RunResult, free: RunResult) -> float:
    """Seconds the fault cost: training time over the fault-free run's, and the wait before a resume if there was
    one (training time counts each step once, so that wait is not in it)."""
    waited = (killed.fault or {}).get("fault_to_resume_s") or 0.0
    return killed.train_time_s - free.train_time_s + waited


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="virtual nodes of 2 ranks: F, one group per node")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fault-step", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="more launcher overrides for every command (train=learn)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        fault = [f"train.fault_step={args.fault_step}", "train.fault_group=1"]
        checkpoints = [f"train.checkpoint_every={args.checkpoint_every}", "retries=1"]
        n, steps = args.repeats, args.steps
        ft_free = sweep(out, "groups_free", args, "train.fault_tolerance=groups")
        ft_kill = sweep(out, "groups_kill", args, "train.fault_tolerance=groups", *fault)
        re_free = sweep(out, "restart_free", args, *checkpoints)
        re_kill = sweep(out, "restart_kill", args, *checkpoints, *fault)
    print(f"\nFL+FSDP ({args.nodes},1,2) A=8 on tiny {' '.join(args.overrides)}, {steps} steps, group 1 killed after "
          f"step {args.fault_step}; "
          f"restart path: checkpoint every {args.checkpoint_every}, retries=1")
    print("| seed | path | train time (s) | fault-free (s) | time lost (s) | tokens lost or retrained | "
          "ln eval_ppl | fault-free | loss change |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|---:|")
    lost = {"groups": [], "restart": []}
    for k in range(n):
        for path, killed, free in (("groups", ft_kill[k], ft_free[k]), ("restart", re_kill[k], re_free[k])):
            f = killed.fault or {}
            tokens = f.get("tokens_lost", f.get("tokens_retrained"))
            a, b = math.log(killed.eval_ppl), math.log(free.eval_ppl)
            lost[path].append(lost_s(killed, free))
            print(f"| {k + 1} | {path} | {killed.train_time_s:.2f} | {free.train_time_s:.2f} | {lost[path][-1]:.2f} | "
                  f"{tokens} | {a:.4f} | {b:.4f} | {100 * (a - b) / b:+.2f} % |")
    print(f"\nmedian time lost: groups {statistics.median(lost['groups']):.2f} s, restart from a checkpoint "
          f"{statistics.median(lost['restart']):.2f} s; goodput of the killed groups runs over their fault-free runs: "
          + ", ".join(f"{ft_kill[k].goodput / ft_free[k].goodput:.3f}" for k in range(n))
          + "; fault-free training time, groups over one world: "
          + ", ".join(f"{ft_free[k].train_time_s / re_free[k].train_time_s:.3f}" for k in range(n)))


if __name__ == "__main__":
    main()
