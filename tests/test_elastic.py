"""Elastic resume (train.elastic): an FL run killed while checkpointing continues on fewer federation groups
from the federation's last average, and the result says which data streams were no longer trained."""
import json

import pytest

from tests import forked
from tests.support import clean_env, losses
from train.contract.result import RunResult

STEPS, EVERY, A = 40, 10, 5


def _spec(tmp_path, name, F, elastic=True, strategy="fl_fsdp", S=1, **train):
    spec = {"strategy": strategy, "F": F, "R": 1, "S": S, "A": A if F > 1 else None, "out_dir": str(tmp_path / "run"),
            "run_id": f"{strategy}-elastic", "model": {"preset": "tiny"},
            "train": {"steps": STEPS, "seq_len": 32, "lr": 1e-2, "log_every": 5, "checkpoint_every": EVERY,
                      "elastic": elastic, **train}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _torchrun(spec, ranks, entry=("train",)) -> forked.Ranks:
    """`torchrun --nproc_per_node RANKS -m ENTRY... SPEC` to the end, on forked ranks (tests/forked.py)."""
    proc = forked.torchrun(*entry, str(spec), nproc=ranks, env=clean_env())
    proc.wait(timeout=600)
    return proc


def _crashed(spec, ranks) -> dict:
    """Run `spec` on `ranks` ranks until rank 1 dies writing the step-30 checkpoint (step 20's is the latest);
    the losses it logged."""
    first = _torchrun(spec, ranks, entry=("tests.crash_in_checkpoint", "30", "1"))
    assert first.returncode != 0
    return {step: loss for step, loss, _ in losses(spec.parent / "run")}


def _resumed(spec, ranks, before: dict) -> RunResult:
    """Resume on the new layout: the curve goes on from step 20 (no jump back towards the initial loss) and
    keeps falling; every step is logged once."""
    second = _torchrun(spec, ranks)
    assert second.returncode == 0, second.stderr[-2000:]
    after = {step: loss for step, loss, _ in losses(spec.parent / "run")}
    assert sorted(after) == list(range(1, STEPS + 1))
    assert abs(after[21] - before[20]) < abs(after[21] - before[1])
    assert after[STEPS] < before[20]
    return RunResult.load(spec.parent / "run" / "result.json")


def test_an_fl_run_resumes_on_fewer_groups_from_the_last_average(tmp_path):
    before = _crashed(_spec(tmp_path, "four", 4), 4)  # 4 groups; step 20 is a FedAvg step
    refused = _torchrun(_spec(tmp_path, "two-strict", 2, elastic=False), 2)
    assert refused.returncode != 0 and "needs train.elastic=true" in refused.stderr
    result = _resumed(_spec(tmp_path, "two", 2), 2, before)
    assert result.resumed_from_step == 20 and (result.F, result.world_size) == (2, 2)
    assert result.layout_changes == [{"from": {"strategy": "fl_fsdp", "F": 4, "R": 1, "S": 1, "A": A},
                                      "to": {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": A},
                                      "at_step": 20, "streams_dropped": 2}]
    assert result.tokens == (20 * 4 + 20 * 2) * 2 * 32  # every attempt's world, steps x ranks x batch x seq


@pytest.mark.slow
def test_fsdp_resumes_on_fewer_shards_and_dcp_reshards_parameters_and_moments(tmp_path):
    # Parameters and AdamW moments resharded from 4 shards to 2: a wrong reshard would start from scrambled
    # weights, far above even the initial loss.
    before = _crashed(_spec(tmp_path, "four", 1, strategy="fsdp", S=4), 4)
    result = _resumed(_spec(tmp_path, "two", 1, strategy="fsdp", S=2), 2, before)
    assert result.resumed_from_step == 20 and (result.S, result.world_size) == (2, 2)
    assert result.layout_changes == [{"from": {"strategy": "fsdp", "F": 1, "R": 1, "S": 4, "A": None},
                                      "to": {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "A": None},
                                      "at_step": 20, "streams_dropped": 2}]


@pytest.mark.slow
def test_a_pipelined_tensor_parallel_run_resumes_on_fewer_shards(tmp_path):
    """tp = 2 x pp = 2 under FSDP, from 2 shards (8 ranks) to 1 (4 ranks): DCP reshards each stage's
    tensor-split parameters and moments, kept under the stage's own keys."""
    big = {"tp": 2, "pp": 2, "batch_per_rank": 16}  # 2 data ranks: a larger batch, so the loss visibly falls
    before = _crashed(_spec(tmp_path, "eight", 1, strategy="fsdp", S=2, **big), 8)
    result = _resumed(_spec(tmp_path, "four", 1, strategy="fsdp", S=1, **big), 4, before)
    assert result.resumed_from_step == 20 and (result.S, result.tp, result.pp, result.world_size) == (1, 2, 2, 4)
    assert result.layout_changes[0]["at_step"] == 20
