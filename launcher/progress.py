"""Sweep-wide progress while the launcher waits: runs done / running / queued, the step each running run has
logged, the elapsed time, and an estimate of the time left: training from the seconds per step measured so far,
plus each run still to start its measured overhead (start-up, evaluation, teardown: a finished run's wall time
less its training time). Queue waits are not in it, and the line says so."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    run_id: str
    step: int          # the last step metrics.jsonl holds (0: none logged yet)
    elapsed_s: float   # training time at that step
    steps: int


def last_step(run_dir: Path) -> tuple[int, float]:
    """(step, elapsed_s) of the last complete line of <run_dir>/metrics.jsonl, or while a run of fault-tolerant groups
    trains (train.fault_tolerance=groups: the run's file is merged at the end) of its group 0's; (0, 0.0) when there is
    none."""
    path = run_dir / "metrics.jsonl"
    if not path.exists() and (run_dir / "group0").is_dir():
        path = run_dir / "group0" / "metrics.jsonl"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            lines = fh.read().split(b"\n")[:-1]  # the last piece is an unfinished line (or empty)
    except OSError:
        return 0, 0.0
    for line in reversed(lines):
        try:
            row = json.loads(line)
            return int(row["step"]), float(row["elapsed_s"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0, 0.0


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def time_left(running: list[Running], queued_steps: list[int], sequential: bool) -> float | None:
    """Training seconds left: each running run's own pace for its remaining steps, the mean pace for queued
    runs; summed when runs go one at a time, the longest when they run side by side. None before any step."""
    paces = {r.run_id: r.elapsed_s / r.step for r in running if r.step > 0}
    if not paces:
        return None
    mean = sum(paces.values()) / len(paces)
    left = [(r.steps - r.step) * paces.get(r.run_id, mean) for r in running] + [s * mean for s in queued_steps]
    return sum(left) if sequential else max(left, default=0.0)


def line(elapsed_s: float, done: int, total: int, running: list[Running], queued_steps: list[int],
         sequential: bool, overhead_s: float | None = None) -> str:
    """`overhead_s`: the mean seconds a finished run spent outside training (None before one finished)."""
    now = ", ".join(f"{r.run_id} step {r.step}/{r.steps}" if r.step else f"{r.run_id} starting" for r in running)
    left = time_left(running, queued_steps, sequential)
    if left is None:
        eta = "time left: estimating"
    elif overhead_s is None:
        eta = f"~{duration(left)} of training left (start-up not measured yet; queue waits not included)"
    else:
        # runs that have not started training yet each pay it (one at a time, they add up)
        starts = len(queued_steps) + sum(r.step == 0 for r in running)
        extra = (starts if sequential else min(starts, 1)) * overhead_s
        eta = (f"~{duration(left + extra)} left: {duration(left)} training, {duration(extra)} start-up and "
               f"evaluation (queue waits not included)")
    return (f"[{duration(elapsed_s)}] {done}/{total} done, running: {now or 'none'}, queued: {len(queued_steps)}; "
            f"{eta}")
