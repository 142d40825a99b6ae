"""A non-finite gradient in one federation group stops the run (or drops that step) before it reaches another
group or a checkpoint (train.on_nonfinite), on real gloo ranks: FedAvg, DiLoCo in fp32 and DiLoCo over int8."""
import json
import math
from pathlib import Path

import pytest

from train.contract.common import NonFiniteError
from train.contract.spec import RunSpec

POISONED_STEP, POISONED_RANK = 2, 1  # 0-based step 2 (the third), in federation group 1
OUTERS = {"fedavg": {}, "diloco_fp32": {"outer": "diloco"},
          "diloco_int8": {"outer": "diloco", "aggregation_dtype": "int8"}}


def _poisoned_run(rank: int, world: int, out_dir: str, train: dict) -> dict:
    import torch

    from train.loop import Trainer

    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 2, "out_dir": out_dir,
                              "train": {"steps": 8, "seq_len": 16, "checkpoint_every": 2, **train}})
    trainer = Trainer(spec, rank, "cpu", out_dir=Path(out_dir))
    observe = trainer.guard.after_backward

    def poison_then_observe(step, loss):  # one inf in one gradient of one group, as an overflow would leave it
        if rank == POISONED_RANK and step == POISONED_STEP:
            grad = next(p.grad for p in trainer.model.parameters() if p.grad is not None)
            grad.to_local().view(-1)[0] = float("inf")
        return observe(step, loss)

    trainer.guard.after_backward = poison_then_observe
    outcome = {"error": None, "result": None}
    try:
        result = trainer.run("gloo")
        outcome["result"] = None if result is None else result.to_dict()
    except NonFiniteError as exc:
        outcome["error"] = str(exc)
    params = [p.to_local() if hasattr(p, "to_local") else p for p in trainer.model.parameters()]
    outcome["finite"] = all(bool(torch.isfinite(p).all()) for p in params)
    outcome["checksum"] = float(sum(p.double().sum() for p in params)) if outcome["finite"] else None
    return outcome


@pytest.mark.parametrize("outer", sorted(OUTERS))
def test_an_inf_gradient_is_never_averaged_and_stops_the_run_before_the_next_checkpoint(outer, tmp_path):
    from tests.support import run_ranks

    ranks = run_ranks(_poisoned_run, 2, str(tmp_path), OUTERS[outer])
    errors = {r["error"] for r in ranks}
    assert len(errors) == 1 and None not in errors  # every rank stops, with the same line
    line = errors.pop()
    assert "\n" not in line
    assert line.startswith("the gradient of ") and "was not finite at step 3 on rank 1 (federation group 1)" in line
    assert "stopped before this checkpoint" in line  # step 4 averaged (nothing of group 1's), then compared
    assert ranks[0]["finite"]  # the other group never received it
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    steps = [json.loads((tmp_path / "checkpoints" / c / "meta.json").read_text())["step"] for c in checkpoints]
    assert steps == [2]  # the last good checkpoint is kept; none was written after the poisoned step
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize("outer", sorted(OUTERS))
def test_skip_step_drops_the_poisoned_update_on_every_rank(outer, tmp_path):
    from tests.support import run_ranks

    ranks = run_ranks(_poisoned_run, 2, str(tmp_path), {**OUTERS[outer], "on_nonfinite": "skip_step"})
    assert all(r["error"] is None and r["finite"] for r in ranks)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # one model after the final FedAvg
    result = ranks[0]["result"]  # group 1 dropped the step, group 0 (rank 0) did not need to wait for it
    assert result["skipped_steps"] == 1 and math.isfinite(result["eval_ppl"])
