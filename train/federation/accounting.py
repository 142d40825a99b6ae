"""A fault-tolerant run's result (train.fault_tolerance=groups): each federation group's last life wrote its own
result.json, metrics.jsonl and evals.jsonl in <run>/group<g>/; this joins them into the run's, with what every loss
cost (issue 56, item 4), once every group ended well: the local job's supervisor (train.job.forked_ranks) or, on
SLURM, the launcher that watches each group's job (launcher.actions.groups) calls it.

A lost group's steps count as useful up to its last average before the fault (what reached the others), and again
from the step it healed at; the steps between were lost (its own, dropped with its process, and those it missed
while down). A group that healed without being lost (it came late to an average) dropped the steps it had trained
since its last one. Torch-free: it reads files."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

from train.contract.common import atomic
from train.contract.result import RankRecord, RunResult
from train.contract.spec import RunSpec
from train.federation.lighthouse import clear_ready
from train.runtime.fault import MARK

NO_LIFE = {"heals": [], "short_rounds": [], "trained_tokens": 0, "merged_tokens": 0}  # a left-out group's last life


def merge(spec: RunSpec, restarts: list[dict], left_out: list[int] = ()) -> RunResult:
    """The run's result from its groups' (written to <run>/result.json); `restarts`: the supervisor's record of each
    group started again ({group, start, at, why}); `left_out`: lost groups that never came back (launcher.actions.
    groups), whose last life wrote nothing: what reached an average before their loss still counts."""
    run_dir, L, t = Path(spec.out_dir), spec.layout, spec.train
    ended = [g for g in range(L.F) if g not in left_out]
    parts = [RunResult.load(run_dir / f"group{g}" / "result.json") for g in ended]
    per_step = L.R * L.S * t.batch_per_rank * t.seq_len  # one group's tokens per step
    fault = json.loads((run_dir / MARK).read_text()) if (run_dir / MARK).exists() else None
    lives = dict(zip(ended, (part.groups[0] for part in parts)))
    groups = [{**_group(g, lives.get(g, NO_LIFE), [r for r in restarts if r["group"] == g], fault, L.A, per_step),
               "left_out": g in left_out} for g in range(L.F)]
    useful = sum(g["merged_tokens"] for g in groups)
    base = next((p for g, p in zip(ended, parts) if groups[g]["starts"] == 1), parts[0])  # a group never lost
    for name in ("metrics.jsonl", "evals.jsonl"):
        source = run_dir / f"group{base.groups[0]['group']}" / name
        if source.exists():
            with atomic(run_dir / name) as tmp:
                shutil.copyfile(source, tmp)
    size = L.group_world
    train_time = max(p.train_time_s for p in parts)
    merged = dataclasses.replace(
        base, world_size=L.world, tokens_per_s_per_device=base.tokens_per_s / L.world,
        ranks=[RankRecord(**{**dataclasses.asdict(r), "rank": g * size + r.rank})
               for g, p in zip(ended, parts) for r in p.ranks],
        peak_memory_bytes=max(p.peak_memory_bytes for p in parts), train_time_s=train_time,
        aggregation_bytes=max(p.aggregation_bytes for p in parts),
        train_ppl=math.exp(sum(math.log(p.train_ppl) for p in parts) / len(parts)),  # each group's mean loss
        fault=_fault(fault, groups),
        groups=groups, goodput=useful / (L.world * train_time))
    clear_ready(spec)
    merged.save(run_dir / "result.json")
    return merged


def _fault(fault: dict | None, groups: list[dict]) -> dict | None:
    """result.json's `fault`: what struck and, for a kill, what its group's loss cost (its first loss)."""
    if fault is None:
        return None
    seen = {k: fault[k] for k in ("kind", "step", "group", "at", "speed") if k in fault}
    losses = groups[fault["group"]]["losses"]
    if fault["kind"] != "kill" or not losses:
        return seen
    return {**seen, **{k: losses[0][k] for k in ("healed_step", "fault_to_heal_s", "tokens_lost")},
            "left_out": groups[fault["group"]]["left_out"]}


def _group(group: int, life: dict, restarts: list[dict], fault: dict | None, A: int, per_step: int) -> dict:
    """One group's record: its last life's (life), its losses from the supervisor's restarts and the fault mark."""
    losses, earlier = [], 0  # earlier: tokens of lost lives that reached an average
    for i, restart in enumerate(restarts):
        struck = fault is not None and fault["kind"] == "kill" and fault["group"] == group and i == 0
        step = fault["step"] if struck else None
        healed = life["heals"][0] if i == len(restarts) - 1 and life["heals"] else None
        averaged = step - step % A if step is not None else None  # its last average before the fault
        if averaged is not None and i == 0:
            earlier = averaged * per_step
        losses.append({
            "at": restart["at"], "why": restart["why"], "fault_step": step,
            "healed_step": healed["step"] if healed else None,
            "fault_to_heal_s": round(healed["at"] - fault["time"], 3) if healed and struck else None,
            "tokens_lost": (healed["step"] - averaged) * per_step if healed and averaged is not None else None})
    late = [h for h in life["heals"] if h.get("dropped_tokens")]
    return {"group": group, "starts": 1 + len(restarts), "losses": losses, "heals": life["heals"],
            "late_heals": len(late), "short_rounds": life["short_rounds"],
            "trained_tokens": life["trained_tokens"], "merged_tokens": earlier + life["merged_tokens"]}
