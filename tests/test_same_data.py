"""Layouts on the same ranks train on the same sequences (issue 41, item 1).

On 8 gloo ranks, each strategy at tp = pp = 1 and with tp = 2, pp = 2 or both, at the same global batch (the
launcher multiplies batch_per_rank by tp x pp, as here): in fp32 the losses agree step by step within 1e-5
relative, group by group for FL (A = STEPS, so no aggregation comes between the steps compared). Before step t's
sequences were a function of (seed, t, global batch) alone, a data-parallel degree halved by tp drew other
sequences: the losses then differed by 1.5e-4 relative at step 1 and 2.1e-3 within 3 steps.
"""
import functools

import pytest

from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.loop import Trainer

STEPS, WORLD, TOL = 4, 8, 1e-5
# (F, R, S) at tp = pp = 1 on 8 ranks; a model-parallel layout halves R x S (S first) once per axis of 2
BASE = {"fsdp": (1, 1, 8), "hsdp": (1, 2, 4), "fl_fsdp": (2, 1, 4), "fl_hsdp": (2, 2, 2)}
AXES = {"tp1_pp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2), "tp2_pp2": (2, 2)}


def _spec(strategy: str, axes: str) -> dict:
    F, R, S = BASE[strategy]
    tp, pp = AXES[axes]
    for _ in range((tp * pp).bit_length() - 1):
        R, S = (R, S // 2) if S > 1 else (R // 2, S)
    return {"strategy": strategy, "F": F, "R": R, "S": S, "A": STEPS if F > 1 else None, "out_dir": "/nonexistent",
            "model": {"preset": "tiny"},
            "train": {"steps": STEPS, "seq_len": 16, "batch_per_rank": tp * pp, "tp": tp, "pp": pp, "lr": 1e-3,
                      "eps": 1e-6, "warmup_frac": 0.1}}


def _worker(rank, world, specs):
    """Every layout in turn on the same ranks: (federation group, losses) where this rank holds the last stage."""
    out = []
    for spec_dict in specs:
        trainer = Trainer(RunSpec.from_dict(spec_dict), rank, "cpu")
        trainer.restore()
        losses = [trainer.step(i).item() for i in range(STEPS)]
        f, _, _, p, _ = trainer.coord
        out.append((f, losses if p == trainer.layout.P - 1 else None))
    return out


@functools.cache
def _group_losses() -> dict:
    """(strategy, axes) -> each federation group's loss per step: the mean over its last-stage ranks."""
    cases = [(s, a) for s in BASE for a in AXES]
    by_rank = run_ranks(_worker, WORLD, [_spec(*c) for c in cases])
    out = {}
    for i, case in enumerate(cases):
        groups: dict[int, list] = {}
        for f, losses in (outs[i] for outs in by_rank):
            if losses is not None:
                groups.setdefault(f, []).append(losses)
        out[case] = {f: [sum(step) / len(step) for step in zip(*ls)] for f, ls in groups.items()}
    return out


@pytest.mark.parametrize("strategy", list(BASE))
@pytest.mark.slow
def test_model_parallel_layouts_see_the_same_sequences_as_pure_data_parallel(strategy):
    assert {RunSpec.from_dict(_spec(strategy, a)).world_size for a in AXES} == {WORLD}
    outcomes = _group_losses()
    base = outcomes[(strategy, "tp1_pp1")]
    assert len(base) == BASE[strategy][0]
    for axes in list(AXES)[1:]:
        mine = outcomes[(strategy, axes)]
        assert mine.keys() == base.keys()
        for f in base:
            rel = max(abs(a - b) / abs(b) for a, b in zip(mine[f], base[f]))
            print(f"{strategy} {axes} group {f}: worst loss rel diff over {STEPS} steps {rel:.2e}")
            assert rel <= TOL, f"{strategy} {axes} group {f}: losses differ from tp = pp = 1 by {rel:.2e} relative"
    if len(base) > 1:  # federation groups train on their own slices, so their losses differ
        assert base[0] != base[1]
