"""What a lost or slow federation group costs, side by side on cluster=local (issue 56): fault-tolerant groups
(train.fault_tolerance=groups: the others go on, the lost or late group heals from a peer) against today's path, on
the same fault, step and seeds.

--kind kill (default): four launcher commands, each sweep.repeats seeds of the smoke sweep's FL+FSDP run on `tiny`
(A = 8, one group per node of 2 ranks): fault-free and with group 1 killed after --fault-step, with and without fault
tolerance; without it the job fails and `retries=1` resumes every group from the last checkpoint. Per seed: the
training time, the time lost to the fault (training time over the fault-free run's of the same path and seed, plus
the seconds from the fault to the resume where the run was resumed), the tokens lost or trained again, and the final
eval loss (ln eval_ppl) against the fault-free run's.

--kind slow: group 1 runs at --speed of its speed from --fault-step on, with fault-tolerant groups (the others wait
--grace seconds for it at each average) and with today's synchronous FedAvg (every average waits for it). Per seed:
the seconds a group that was not slowed (group 0) took to its last step against the unslowed run's (their ratio is
its tokens/s over the unslowed run's), and the final eval loss against the unslowed run's.

--kind pairs: the fault-tolerant groups path alone, one fault-free and one killed run per seed of --seeds, the
two back to back and their order alternating from seed to seed (fault-free first for the first seed), so that a
machine whose pace drifts over the hour meets both sides alike. Per seed the kill table's groups row; over the
seeds the fault-free-paired geometric mean of useful tokens/s over fault-free, with its 95 % interval (Student t on
the log ratios, launcher.report.stats.ratio_interval).

--cluster testbed: the same on the SLURM testbed (slurm/testbed/testbed.py up first; the launcher runs through its
lab wrapper), each federation group a SLURM job of its own. A killed group's node goes DOWN; this bench plays the
operator who repairs it, returning it to service --repair-s seconds later (repairs.json beside the sweeps says
when). The restart path is today's SLURM path: retry_shrink=true, the run resumed from its checkpoint on the nodes
left. Per seed it also says when the lost group healed after its node was back, and group 0's longest gap between
two steps.

Run: python -m bench.fault_tolerance [--kind kill|slow|pairs] [--seeds 45 46 ...] [--cluster local|testbed] [--nodes
2] [--steps 80] [--fault-step 30] [--checkpoint-every 16] [--speed 0.5] [--grace 0.2] [--repair-s 10] [--repeats 3]
[--out DIR] [--report] [KEY=VALUE ...] (more launcher overrides, e.g. train=learn); --report with the same arguments
prints the tables again from the sweeps in --out without running anything (tests/test_committed_results.py checks
the committed study's README that way)
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from launcher.report.stats import ratio_interval
from train.contract.common import write_atomic
from train.contract.result import RunResult
from train.contract.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
LAB = str(ROOT / "slurm" / "testbed" / "lab")


def rule(out: Path) -> str:
    """The heading of the verdicts: the rule is the one registered in --out's README (each study folder has its own)."""
    readme = out.resolve() / "README.md"
    where = readme.relative_to(ROOT) if readme.is_relative_to(ROOT) else readme
    return f"\nthe registered rule ({where}), fault-tolerant groups:\n"


def sweep(out: Path, name: str, args, *overrides: str) -> list[Path]:
    """One launcher command; the run directories of its repeats, in repeat order. On the testbed a killed group's
    node is repaired while it runs (Repairs)."""
    results_dir, run = out / name, f"fl_fsdp-F{args.nodes}-R1-S2-A8"
    cmd = [sys.executable, "-m", "launcher", "sweep=smoke", f"cluster={args.cluster}", "model=tiny",
           "sweep.strategies=[fl_fsdp]", "sweep.A=[8]", f"sweep.nodes=[{args.nodes}]",
           f"sweep.train.steps={args.steps}", f"sweep.repeats={args.repeats}", f"results_dir={results_dir}",
           *args.overrides, *overrides]
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    if args.report:
        pass  # the sweep ran before: its results are read as they are
    elif args.cluster == "testbed":
        with Repairs(results_dir / "repairs.json", args.repair_s):
            subprocess.run([LAB, *cmd], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    else:
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    runs = results_dir / args.cluster / "smoke"
    return [runs / (run if k == 1 else f"{run}-rep{k}") for k in range(1, args.repeats + 1)]


class Repairs:
    """The testbed's operator: a node an injected fault set DOWN (its reason names the fault) is returned to service
    `repair_s` seconds after this thread first sees it down; every repair is written to `path` ({node, down_at,
    back_at}, epoch seconds)."""

    def __init__(self, path: Path, repair_s: float):
        self.path, self.repair_s, self.done = path, repair_s, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        write_atomic(self.path, json.dumps(self.done, indent=1))

    def _watch(self) -> None:
        while not self.stop.wait(0.2):
            listed = subprocess.run([LAB, "sinfo", "-R", "-h", "-o", "%E|%N"], capture_output=True, text=True)
            down = [line.split("|")[1] for line in listed.stdout.splitlines() if line.startswith("fedshard fault")]
            for node in down:
                seen = time.time()
                time.sleep(self.repair_s)
                subprocess.run([LAB, "scontrol", "update", f"nodename={node}", "state=resume"], check=True)
                self.done.append({"node": node, "down_at": seen, "back_at": time.time()})


def result(run_dir: Path) -> RunResult:
    return RunResult.load(run_dir / "result.json")


def lost_s(killed: RunResult, free: RunResult) -> float:
    """Seconds the fault cost: training time over the fault-free run's, and the wait before a resume if there was
    one (training time counts each step once, so that wait is not in it)."""
    waited = (killed.fault or {}).get("fault_to_resume_s") or 0.0
    return killed.train_time_s - free.train_time_s + waited


def loss_change(run: RunResult, reference: RunResult) -> str:
    return f"{math.log(run.eval_ppl):.4f} | {math.log(reference.eval_ppl):.4f} | {change(run, reference):+.2f} %"


def group0_s(run_dir: Path) -> float:
    """Training seconds to the last step of group 0, never slowed: its own log in a fault-tolerant run (before the
    closing averages that wait for a late group), the run's otherwise."""
    path = run_dir / "group0" / "metrics.jsonl" if (run_dir / "group0").is_dir() else run_dir / "metrics.jsonl"
    return json.loads(path.read_text().splitlines()[-1])["elapsed_s"]


def useful_rate(run: RunResult, free: RunResult) -> float:
    """Tokens that reached the final model per second of wall time, over the fault-free run's: the groups' goodput
    ratio (their merged tokens over ranks x the longest group's time); for a restarted run its final tokens over its
    training time plus the time the fault cost (lost_s)."""
    if run.goodput is not None and free.goodput is not None:
        return run.goodput / free.goodput
    return run.tokens / (free.train_time_s + lost_s(run, free)) / (free.tokens / free.train_time_s)


def longest_gap(run_dir: Path) -> tuple[float, float]:
    """Group 0's longest wait between two logged steps, and its median one (a fault-tolerant run's own log)."""
    path = run_dir / "group0" / "metrics.jsonl" if (run_dir / "group0").is_dir() else run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    return max(gaps), statistics.median(gaps)


def healed_after_back(run: RunResult, repairs: list[dict]) -> float | None:
    """Seconds from the killed group's node back in service (the repair after this run's fault) to its heal."""
    heal = next((h for g in run.groups or [] for h in g["heals"] if g["starts"] > 1), None)
    fault_at = run.fault and datetime.fromisoformat(run.fault["at"]).timestamp()
    back = [r["back_at"] for r in repairs if fault_at and r["down_at"] >= fault_at - 1]
    return heal["at"] - min(back) if heal and back else None


KILL_TABLE = ("| seed | path | train time (s) | fault-free (s) | time lost (s) | tokens lost or retrained | useful "
              "tokens/s over fault-free | ln eval_ppl | fault-free | loss change | healed after node back (s) | "
              "group 0's longest gap (s) | its median step (s) |\n|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|"
              "---:|---:|---:|")


def killed_heading(args, paths: str) -> str:
    """The kill tables' heading: the run, the fault, `paths` (what ran beside it) and, on the testbed, the repair."""
    return (f"\nFL+FSDP ({args.nodes},1,2) A=8 on tiny {' '.join(args.overrides)} on cluster={args.cluster}, "
            f"{args.steps} steps, group 1 killed after step {args.fault_step}{paths}"
            + (f"; the node back {args.repair_s:g} s after it went DOWN" if args.cluster == "testbed" else ""))


def fault_overrides(args) -> list[str]:
    """Group 1 struck after --fault-step (killed, unless train.fault_kind says otherwise)."""
    return [f"train.fault_step={args.fault_step}", "train.fault_group=1"]


def repairs_of(sweep_dir: Path, args) -> list[dict]:
    """The repairs the bench made while a killed sweep ran (none off the testbed: no node goes DOWN)."""
    return json.loads((sweep_dir / "repairs.json").read_text()) if args.cluster == "testbed" else []


def groups_row(seed: int, kill_dir: Path, free: RunResult, repairs: list[dict], lost: list[float]) -> tuple:
    """Print a killed fault-tolerant run's row of the kill table (its time lost appended to `lost`); its checks
    K1-K4 of the registered rule, and its useful tokens/s over fault-free."""
    killed = result(kill_dir)
    lost.append(lost_s(killed, free))
    healed, (gap, median) = healed_after_back(killed, repairs), longest_gap(kill_dir)
    rate, grace = useful_rate(killed, free), RunSpec.load(kill_dir / "spec.json").train.grace_s
    print(f"| {seed} | groups | {killed.train_time_s:.2f} | {free.train_time_s:.2f} | {lost[-1]:.2f} | "
          f"{(killed.fault or {}).get('tokens_lost')} | {rate:.3f} | {loss_change(killed, free)} | {_num(healed)} | "
          f"{_num(gap)} | {_num(median)} |")
    return [("K1", gap < grace + median, f"longest gap {gap:.2f} s < {grace:g} + {median:.2f} s"),
            ("K2", healed is not None and healed <= 60, f"healed {_num(healed)} s after its node was back"),
            ("K3", rate >= 0.90, f"useful tokens/s {rate:.3f}"),
            ("K4", abs(change(killed, free)) <= 1, f"loss change {change(killed, free):+.2f} %")], rate


def kill(args, out: Path) -> None:
    fault = fault_overrides(args)
    checkpoints = [f"train.checkpoint_every={args.checkpoint_every}", "retries=1",
                   *(["retry_shrink=true"] if args.cluster == "testbed" else [])]
    n = args.repeats
    free_dirs, kill_dirs = (sweep(out, name, args, "train.fault_tolerance=groups", *extra)
                            for name, extra in (("groups_free", []), ("groups_kill", fault)))
    ft_free = list(map(result, free_dirs))
    re_free, re_kill = (list(map(result, sweep(out, name, args, *checkpoints, *extra)))
                        for name, extra in (("restart_free", []), ("restart_kill", fault)))
    repairs = repairs_of(out / "groups_kill", args)
    restart = "retry_shrink=true, " if args.cluster == "testbed" else ""
    print(killed_heading(args, f"; restart path: {restart}checkpoint every {args.checkpoint_every}, retries=1"))
    print(KILL_TABLE)
    lost, verdicts = {"groups": [], "restart": []}, []
    for k in range(n):
        checks, _ = groups_row(k + 1, kill_dirs[k], ft_free[k], repairs, lost["groups"])
        verdicts.append(_verdicts(f"repeat {k + 1}", checks))
        killed, free = re_kill[k], re_free[k]
        lost["restart"].append(lost_s(killed, free))
        print(f"| {k + 1} | restart | {killed.train_time_s:.2f} | {free.train_time_s:.2f} | {lost['restart'][-1]:.2f} "
              f"| {(killed.fault or {}).get('tokens_retrained')} | {useful_rate(killed, free):.3f} | "
              f"{loss_change(killed, free)} | – | – | – |")
    print(f"\nmedian time lost: groups {statistics.median(lost['groups']):.2f} s, restart from a checkpoint "
          f"{statistics.median(lost['restart']):.2f} s; fault-free training time, groups over one world: "
          + ", ".join(f"{ft_free[k].train_time_s / re_free[k].train_time_s:.3f}" for k in range(n)))
    print(rule(out) + "\n".join(verdicts))


def pairs(args, out: Path) -> None:
    fault = fault_overrides(args)
    args.repeats, runs = 1, {}  # each launcher command one run, its seed given as train.seed
    for i, seed in enumerate(args.seeds):
        order = (("free", []), ("kill", fault))[::1 if i % 2 == 0 else -1]
        for name, extra in order:
            runs[seed, name] = sweep(out / f"seed{seed}", f"groups_{name}", args, "train.fault_tolerance=groups",
                                     f"train.seed={seed}", *extra)[0]
    print(killed_heading(args, ", fault-tolerant groups; fault-free and killed back to back, alternating which goes "
                               "first"))
    print(KILL_TABLE)
    verdicts, lost, rates = [], [], []
    for seed in args.seeds:
        checks, rate = groups_row(seed, runs[seed, "kill"], result(runs[seed, "free"]),
                                  repairs_of(out / f"seed{seed}" / "groups_kill", args), lost)
        rates.append(rate)
        verdicts.append(_verdicts(f"seed {seed}", [c for c in checks if c[0] != "K3"]))  # K3: over the pairs
    ratio, low, high = ratio_interval(rates)  # each rate is its killed run's over its fault-free partner's
    interval = f" (95 % interval {low:.3f}-{high:.3f})" if low is not None else ""
    verdicts.append(f"- over the {len(args.seeds)} seeds: K3 {'pass' if ratio >= 0.90 else 'MISS'} (useful tokens/s "
                    f"over fault-free, geometric mean {ratio:.3f}{interval}; its lower end "
                    f"{'at or above' if low is not None and low >= 0.90 else 'below'} 0.90)")
    print(rule(out) + "\n".join(verdicts))


def change(run: RunResult, reference: RunResult) -> float:
    """The final eval loss's change over the reference's, in %."""
    a, b = math.log(run.eval_ppl), math.log(reference.eval_ppl)
    return 100 * (a - b) / b


def _verdicts(label: str, checks: list[tuple[str, bool, str]]) -> str:
    return f"- {label}: " + "; ".join(f"{name} {'pass' if ok else 'MISS'} ({why})" for name, ok, why in checks)


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def slow(args, out: Path) -> None:
    fault = [*fault_overrides(args), "train.fault_kind=slow", f"train.fault_speed={args.speed}"]
    groups = ["train.fault_tolerance=groups", f"train.grace_s={args.grace}"]
    runs = {name: sweep(out, name, args, *extra) for name, extra in (
        ("groups_unslowed", groups), ("groups_slowed", [*groups, *fault]), ("sync_unslowed", []),
        ("sync_slowed", fault))}
    print(f"\nFL+FSDP ({args.nodes},1,2) A=8 on tiny {' '.join(args.overrides)}, {args.steps} steps, group 1 at "
          f"{args.speed:g} of its speed from step {args.fault_step}; fault-tolerant groups wait {args.grace:g} s")
    print("| seed | path | group 0 to its last step (s) | unslowed (s) | its tokens/s over unslowed | ln eval_ppl | "
          "unslowed | loss change |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|")
    verdicts = []
    for k in range(args.repeats):
        for path in ("groups", "sync"):
            slowed, unslowed = runs[f"{path}_slowed"][k], runs[f"{path}_unslowed"][k]
            a, b = group0_s(slowed), group0_s(unslowed)
            print(f"| {k + 1} | {path} | {a:.2f} | {b:.2f} | {b / a:.3f} | "
                  f"{loss_change(result(slowed), result(unslowed))} |")
            if path == "groups":
                verdicts.append(_verdicts(f"repeat {k + 1}",
                                          [("S1", b / a >= 0.90, f"group 0's tokens/s {b / a:.3f} of unslowed")]))
    print(rule(out) + "\n".join(verdicts))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("kill", "slow", "pairs"), default="kill")
    parser.add_argument("--cluster", choices=("local", "testbed"), default="local")
    parser.add_argument("--repair-s", type=float, default=10.0,
                        help="--cluster testbed: seconds a killed group's node stays DOWN before it is repaired")
    parser.add_argument("--nodes", type=int, default=2, help="virtual nodes of 2 ranks: F, one group per node")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fault-step", type=int, default=30)
    parser.add_argument("--checkpoint-every", type=int, default=16)
    parser.add_argument("--speed", type=float, default=0.5, help="--kind slow: the slowed group's share of its speed")
    parser.add_argument("--grace", type=float, default=0.2, help="--kind slow: train.grace_s of the groups runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[45, 46, 47, 48, 49, 50],
                        help="--kind pairs: train.seed of each fault-free and killed pair")
    parser.add_argument("--out", type=Path, default=None, help="keep the sweeps here (default: a temporary folder)")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: print the tables again from the sweeps an earlier run left in --out")
    parser.add_argument("overrides", nargs="*", help="more launcher overrides for every command (train=learn)")
    args = parser.parse_args(argv)
    if args.report and args.out is None:
        parser.error("--report reads the sweeps of an earlier run: name their folder with --out")
    with tempfile.TemporaryDirectory() as tmp:
        {"kill": kill, "slow": slow, "pairs": pairs}[args.kind](args, args.out or Path(tmp))


if __name__ == "__main__":
    main()
