"""Elastic resume (train.elastic): an FL run killed while checkpointing continues on fewer federation groups
from the federation's last average, and the result says which data streams were no longer trained."""
import json
import subprocess
import sys

from tests.support import clean_env, losses
from train.result import RunResult

STEPS, EVERY, A = 40, 10, 5


def _spec(tmp_path, name, F, elastic=True, strategy="fl_fsdp", S=1):
    spec = {"strategy": strategy, "F": F, "R": 1, "S": S, "A": A if F > 1 else None, "out_dir": str(tmp_path / "run"),
            "run_id": f"{strategy}-elastic", "model": {"preset": "tiny"},
            "train": {"steps": STEPS, "seq_len": 32, "lr": 1e-2, "log_every": 5, "checkpoint_every": EVERY,
                      "elastic": elastic}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _torchrun(spec, ranks, entry=("train",)):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "-m",
                           *entry, str(spec)], env=clean_env(), capture_output=True, text=True, timeout=600)


def test_an_fl_run_resumes_on_fewer_groups_from_the_last_average(tmp_path):
    # 4 groups; rank 1 dies writing the step-30 checkpoint, so step 20's (a FedAvg step) is the latest.
    first = _torchrun(_spec(tmp_path, "four", 4), 4, entry=("tests.crash_in_checkpoint", "30", "1"))
    assert first.returncode != 0
    before = {step: loss for step, loss, _ in losses(tmp_path / "run")}
    refused = _torchrun(_spec(tmp_path, "two-strict", 2, elastic=False), 2)
    assert refused.returncode != 0 and "needs train.elastic=true" in refused.stderr
    second = _torchrun(_spec(tmp_path, "two", 2), 2)
    assert second.returncode == 0, second.stderr[-2000:]
    result = RunResult.load(tmp_path / "run" / "result.json")
    assert result.resumed_from_step == 20 and (result.F, result.world_size) == (2, 2)
    assert result.layout_changes == [{"from": {"strategy": "fl_fsdp", "F": 4, "R": 1, "S": 1, "A": A},
                                      "to": {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": A},
                                      "at_step": 20, "streams_dropped": 2}]
    assert result.tokens == (20 * 4 + 20 * 2) * 2 * 32  # every attempt's world, steps x ranks x batch x seq
    after = {step: loss for step, loss, _ in losses(tmp_path / "run")}
    assert sorted(after) == list(range(1, STEPS + 1))  # steps 21.. continue the curve, logged once each
    # No jump back: the first step after the resume is nearer the loss before it than the initial loss.
    assert abs(after[21] - before[20]) < abs(after[21] - before[1])
    assert after[STEPS] < before[20]  # and training goes on from there


def test_fsdp_resumes_on_fewer_shards_and_dcp_reshards_parameters_and_moments(tmp_path):
    # FSDP over 4 ranks; rank 1 dies writing the step-30 checkpoint; the run resumes sharded over 2.
    first = _torchrun(_spec(tmp_path, "four", 1, strategy="fsdp", S=4), 4,
                      entry=("tests.crash_in_checkpoint", "30", "1"))
    assert first.returncode != 0
    before = {step: loss for step, loss, _ in losses(tmp_path / "run")}
    second = _torchrun(_spec(tmp_path, "two", 1, strategy="fsdp", S=2), 2)
    assert second.returncode == 0, second.stderr[-2000:]
    result = RunResult.load(tmp_path / "run" / "result.json")
    assert result.resumed_from_step == 20 and (result.S, result.world_size) == (2, 2)
    assert result.layout_changes == [{"from": {"strategy": "fsdp", "F": 1, "R": 1, "S": 4, "A": None},
                                      "to": {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "A": None},
                                      "at_step": 20, "streams_dropped": 2}]
    after = {step: loss for step, loss, _ in losses(tmp_path / "run")}
    # Parameters and AdamW moments resharded from 4 to 2 shards: the curve goes on from step 20 (a wrong
    # reshard would start from scrambled weights, far above even the initial loss).
    assert abs(after[21] - before[20]) < abs(after[21] - before[1])
    assert after[STEPS] < before[20]
