"""Exposed aggregation time per step with and without streaming, on the testbed's spine, in one run.

Runs sweep diloco_streaming (FL+FSDP, DiLoCo, A = 8, the `mini` model) twice on the testbed: whole-shard
syncs every A steps, then N fragments in rotation whose exchanges each overlap `delay` inner steps
(train.outer_fragments, train.outer_delay). Prints, per run, Table 4's aggregation per step (the exposed
part), the exchange time in all (result.json's aggregation_exchange_s per step) and the step time, and the
ratio of exposed aggregation (target <= 0.5, issue 15).
Run inside the testbed: slurm/testbed/lab python -m bench.streaming [--fragments 4] [--delay 1]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from train.contract.result import RunResult

RUN = "fl_fsdp-F4-R1-S2-A8"


def measure(results: Path, *overrides: str) -> RunResult:
    cmd = [sys.executable, "-m", "launcher", "sweep=diloco_streaming", "cluster=testbed", "model=mini",
           f"results_dir={results}", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench.streaming: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return RunResult.load(results / "testbed" / "diloco_streaming" / RUN / "result.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--delay", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        streamed = (f"train.outer_fragments={args.fragments}", f"train.outer_delay={args.delay}")
        runs = {"whole shard": measure(Path(tmp, "whole")),
                f"{args.fragments} fragments, delay {args.delay}": measure(Path(tmp, "streamed"), *streamed)}
    print(f"{'mode':<24} {'exposed agg s/step':>19} {'exchange s/step':>16} {'step s':>8}")
    exposed = {}
    for mode, r in runs.items():
        exposed[mode] = r.phases["aggregation"].mean
        print(f"{mode:<24} {exposed[mode]:>19.4f} {r.aggregation_exchange_s / r.steps:>16.4f} "
              f"{r.train_time_s / r.steps:>8.3f}")
    whole, streamed = exposed.values()
    print(f"exposed aggregation, streamed / whole shard: {streamed / whole:.3f} (target <= 0.5)")


if __name__ == "__main__":
    main()
