"""Evaluations during training (train.eval_every) and time to a target perplexity, on real gloo ranks."""
import json
import subprocess
import sys

import pytest

from tests.support import clean_env
from train.contract.common import SpecError
from train.contract.result import RunResult
from train.contract.spec import RunSpec


def _train(tmp_path, name, **train):
    spec = {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 2, "out_dir": str(tmp_path / name),
            "train": {"steps": 6, "seq_len": 16, "log_every": 2, "eval_every": 2, **train}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "train",
                           str(path)], env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return RunResult.load(tmp_path / name / "result.json"), tmp_path / name


@pytest.mark.slow
def test_target_reached_and_not_reached(tmp_path):
    reached, run_dir = _train(tmp_path, "reached", target_ppl=1e9)  # any model beats it at the first evaluation
    assert [step for step, _, _ in reached.eval_history] == [2, 4, 6]  # every 2 steps, the final one included
    times = [t for _, t, _ in reached.eval_history]
    assert times == sorted(times) and times[-1] == pytest.approx(reached.train_time_s)
    assert reached.eval_history[-1][2] == reached.eval_ppl
    assert (reached.steps_to_target, reached.time_to_target_s) == (2, times[0])
    assert reached.target_ppl == 1e9 and reached.eval_s > 0  # evaluations are timed apart from training
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [[e["step"], e["train_time_s"], e["eval_ppl"]] for e in evals] == reached.eval_history
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == list(range(1, 7))  # one row per step, evaluations apart

    missed, _ = _train(tmp_path, "missed", target_ppl=1.0001)  # below the data's floor: never reached
    assert (missed.time_to_target_s, missed.steps_to_target) == (None, None)
    assert len(missed.eval_history) == 3


def test_federated_evaluations_follow_a_fedavg():
    spec = {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 4, "out_dir": "/tmp/x",
            "train": {"eval_every": 6}}
    with pytest.raises(SpecError, match="train.eval_every=6 must be a multiple of A=4 for fl_fsdp"):
        RunSpec.from_dict(spec)
