"""Phase timers and per-step records reduced across ranks (the result summary is train.loop's).

Per-step numbers are kept locally and reduced in one batch every `log_every`
steps (times: MAX over ranks, loss: mean over ranks), so measuring adds no
collective, barrier or host synchronisation to the training step itself.
"""
from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from train.contract.common import write_atomic
from train.contract.result import PHASES, Stats, StepTimes
from train.measure import exposed


class _Pending(NamedTuple):
    step: int
    marks: list  # the step's phase boundaries (PhaseClock.mark): start, then the end of each phase
    loss: torch.Tensor
    aggregated: bool
    lr: float
    tokens: int  # trained by the run when this step ended
    blocked: object  # waits on communication (train.measure.exposed: seconds, or GPU event pairs); 0.0: not measured
    elapsed_s: float


class PhaseClock:
    """Phase boundaries marked without waiting for anything: on GPU an event recorded on the current stream,
    which the device stamps when its work gets there; on CPU the host's clock (every op has run when it returns,
    gloo's waits included). `laps` reads them at log time, when the step logs anyway: timing adds no
    synchronisation, and no rank waits for another, so federation groups stay uncoupled."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def laps(self, steps: list[list]) -> list[list[float]]:
        """Seconds between consecutive marks, per step. On GPU it waits once, for the last step's last mark: it
        runs only where the step logs (StepLog.flush), which reads the values anyway."""
        if not self.cuda:
            return [[b - a for a, b in zip(marks, marks[1:])] for marks in steps]
        steps[-1][-1].synchronize()
        return [[a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:])] for marks in steps]


class StepLog:
    """Collects StepTimes + loss per step; rank 0 writes metrics.jsonl, and evals.jsonl (one line per
    evaluation during training: step, train_time_s, eval_ppl)."""

    def __init__(self, path: Path | None, world_size: int, device: str):
        self.path, self.world_size, self.device = path, world_size, device
        self.clock = PhaseClock(device)
        self.eval_path = path.with_name("evals.jsonl") if path is not None else None
        self.pending: list[_Pending] = []
        self.rows: list[dict] = []
        self.evals: list[dict] = []
        self.start = time.perf_counter()

    def resume(self, steps_done: int) -> None:
        """Keep the rows and evaluations of the steps a checkpoint covers (rank 0 also trims its files)."""
        self.rows = self._trim(self.path, steps_done)
        self.evals = self._trim(self.eval_path, steps_done)

    @staticmethod
    def _trim(path: Path | None, steps_done: int) -> list[dict]:
        if path is None or not path.exists():
            return []
        rows = [r for r in map(json.loads, path.read_text().splitlines()) if r["step"] <= steps_done]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
        return rows

    def add_eval(self, step: int, train_time_s: float, eval_ppl: float) -> None:
        row = {"step": step, "train_time_s": train_time_s, "eval_ppl": eval_ppl}
        self.evals.append(row)
        if self.eval_path is not None:
            with self.eval_path.open("a") as fh:
                fh.write(json.dumps(row) + "\n")

    def add(self, step: int, marks: list, loss: torch.Tensor, aggregated: bool, lr: float, tokens: int,
            blocked) -> None:
        """Step `step`'s phase boundaries (self.clock's marks: start, forward, backward, optimizer, aggregation)."""
        elapsed = time.perf_counter() - self.start
        self.pending.append(_Pending(step, marks, loss.detach(), aggregated, lr, tokens, blocked, elapsed))

    def flush(self) -> list[dict]:
        if not self.pending:
            return []
        laps = [StepTimes(*t) for t in self.clock.laps([p.marks for p in self.pending])]
        times = torch.tensor([[*t, t.step, exposed.seconds(p.blocked)] for t, p in zip(laps, self.pending)],
                             dtype=torch.float64,
                             device=self.device)
        losses = torch.stack([p.loss.float() for p in self.pending]).to(torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        dist.all_reduce(losses, op=dist.ReduceOp.SUM)
        losses /= self.world_size
        new = []
        for p, t, loss in zip(self.pending, times.tolist(), losses.tolist()):
            *phases, step_time, blocked_s = t  # each a max over ranks: step_time is not the sum of the maxima
            row = {"step": p.step + 1, "loss": loss, "ppl": math.exp(min(loss, 700)), "lr": p.lr,
                   **dict(zip(PHASES, phases)), "step_time": step_time, "aggregated": p.aggregated,
                   "tokens": p.tokens, "blocked_s": blocked_s, "elapsed_s": p.elapsed_s}
            new.append(row)
        self.pending.clear()
        self.rows += new
        if self.path is not None:
            with self.path.open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in new)
        return new

    def _timed_rows(self) -> list[dict]:
        """The steps phase statistics cover: all but the first (warm-up) when there are others."""
        return self.rows[1:] if len(self.rows) > 1 else self.rows

    def phase_stats(self) -> dict[str, Stats]:
        """Mean and std per phase over the same steps, as the paper reports them: aggregation is a mean over
        every step, most of which do not average (about 1/A of a FedAvg event's time)."""
        rows = self._timed_rows()
        return {phase: Stats.of([r[phase] for r in rows]) for phase in PHASES}

    def mean_step_time(self) -> float:
        """Mean step time (max over ranks per step) over the steps phase statistics cover."""
        rows = self._timed_rows()
        return sum(r["step_time"] for r in rows) / len(rows)

    def mean_blocked_s(self) -> float:
        """Mean time blocked in collectives' waits (max over ranks per step) over the steps phase statistics
        cover: the exposed communication (train.measure.exposed)."""
        rows = self._timed_rows()
        return sum(r["blocked_s"] for r in rows) / len(rows)

    def aggregation_event_stats(self) -> Stats:
        """Mean and std of the aggregation phase over the steps that averaged (the FedAvg events) only."""
        return Stats.of([r["aggregation"] for r in self._timed_rows() if r["aggregated"]])

    def first_step(self) -> dict | None:
        """The run's first step when others followed it: communicators are created and memory first allocated
        there, so it is timed apart from throughput (rows before 2026-12 carry no tokens: None)."""
        rows = self.rows
        return rows[0] if len(rows) > 1 and rows[0]["step"] == 1 and "tokens" in rows[0] else None

    def steady_step(self, A: int | None) -> tuple[float, int] | None:
        """(mean seconds per step, steps) after step 2, on the training clock (elapsed_s): from step s0 to the last
        step N, s0 = 2, or with an aggregation period A the latest s0 >= 2 with N - s0 a multiple of A, so the window
        holds whole periods (RunResult.steady_step_s); None when no such window or row is there."""
        if not self.rows:
            return None
        last = self.rows[-1]["step"]
        start = 2 + ((last - 2) % A if A else 0)
        first = next((r for r in self.rows if r["step"] == start), None)
        if last - start < 1 or first is None:
            return None
        return (self.rows[-1]["elapsed_s"] - first["elapsed_s"]) / (last - start), last - start

    def final_loss(self, window: int) -> float:
        tail = self.rows[-window:]
        return sum(r["loss"] for r in tail) / len(tail)


def peak_memory_bytes(device: str) -> int:
    """Peak device memory on GPU; peak resident set size of the process on CPU."""
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def device_memory(device: str) -> dict[str, tuple[str, int]]:
    """On a GPU, beside the peak allocated (what tensors held): the peak the caching allocator reserved, and the
    device's least free and total memory now (torch.cuda.mem_get_info: what the CUDA context, NCCL's buffers and
    other processes leave), for across_ranks; nothing on CPU."""
    if device != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info()
    return {"peak_reserved_bytes": ("max", int(torch.cuda.max_memory_reserved())),
            "device_free_bytes": ("min", int(free)), "device_total_bytes": ("max", int(total))}


REDUCTIONS = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}


def across_ranks(values: dict[str, tuple[str, float]], device: str) -> dict[str, float | int]:
    """Named per-rank numbers, {name: (max | sum, value)}, reduced over every rank by name: one collective per kind
    of reduction and one host read, after training. An int comes back an int, so the result's fields keep their
    types; a new measure is one more entry here and its field in train.contract.result."""
    unknown = {kind for kind, _ in values.values()} - set(REDUCTIONS)
    if unknown:
        raise ValueError(f"unknown reduction(s) {sorted(unknown)}; expected one of {', '.join(REDUCTIONS)}")
    out: dict[str, float | int] = {}
    for how, op in REDUCTIONS.items():
        names = [name for name, (kind, _) in values.items() if kind == how]
        if not names:
            continue
        reduced = torch.tensor([float(values[name][1]) for name in names], dtype=torch.float64, device=device)
        dist.all_reduce(reduced, op=op)
        for name, value in zip(names, reduced.tolist()):
            out[name] = int(value) if isinstance(values[name][1], int) else value
    return out
