"""Faults a sweep must survive: the scheduler's stop signal, a killed launcher, a killed job.

Each test compares per-step losses (and FedAvg steps) with an uninterrupted run of the same
spec: equal bitwise on CPU means nothing was lost, repeated or averaged twice.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import submitit

from train.__main__ import TrainJob
from tests.test_checkpoint import _losses
from tests.test_entrypoint import _env

STEPS = 80


def _wait_for(predicate, what: str, timeout_s: float = 300.0, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert alive(), f"the process ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _steps_logged(run_dir: Path) -> int:
    try:
        return len((run_dir / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _submit_local(tmp_path: Path, name: str):
    spec = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 3, "out_dir": str(tmp_path / name),
            "train": {"steps": STEPS, "seq_len": 16, "log_every": 5, "stop_check_every": 1}}
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    executor = submitit.LocalExecutor(folder=tmp_path / name / "submitit")
    executor.update_parameters(tasks_per_node=4, nodes=1, timeout_min=10)
    return executor.submit(TrainJob(str(tmp_path / f"{name}.json")))


def test_stop_signal_checkpoints_requeues_and_resumes_exactly(tmp_path, monkeypatch):
    """SLURM's pre-emption warning (submitit's USR2), delivered to every task as SLURM does."""
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    reference = _submit_local(tmp_path, "reference")
    assert reference.results()[0]["resumed_from_step"] == 0

    job = _submit_local(tmp_path, "preempted")
    run_dir = tmp_path / "preempted"
    _wait_for(lambda: _steps_logged(run_dir) >= 20, "step 20", alive=lambda: not job.done())
    for task in _children(int(job.job_id)):
        os.kill(task, signal.SIGUSR2)
    result = job.results()[0]
    # No periodic checkpoints were asked for: the one resumed from was written on the signal.
    assert 20 <= result["resumed_from_step"] < STEPS
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"step-{result['resumed_from_step']:06d}"]
    assert _losses(run_dir) == _losses(tmp_path / "reference")
    assert result["aggregations"] == reference.results()[0]["aggregations"]
