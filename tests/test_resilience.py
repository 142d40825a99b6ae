"""Faults a sweep must survive: the scheduler's stop signal, a killed launcher, a killed job.

Each test compares per-step losses (and FedAvg steps) with an uninterrupted run of the same
spec: equal bitwise on CPU means nothing was lost, repeated or averaged twice.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.scheduler import RanksExecutor
from tests.support import children, clean_env, losses, steps_logged, uninterrupted_like, wait_for
from train.contract.result import RunResult
from train.job import TrainJob

STEPS = 80


def _submit_local(tmp_path: Path, name: str):
    """The run as the Local scheduler submits it (one task forking 4 ranks); its reference is the same spec on forked
    ranks (uninterrupted)."""
    spec = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 3, "out_dir": str(tmp_path / name),
            "train": {"steps": STEPS, "seq_len": 16, "log_every": 5, "stop_check_every": 1}}
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    executor = RanksExecutor(folder=tmp_path / name / "submitit", ranks=4)
    executor.update_parameters(tasks_per_node=1, nodes=1, timeout_min=10)
    return executor.submit(TrainJob(str(tmp_path / f"{name}.json")))


@pytest.mark.slow
def test_stop_signal_checkpoints_requeues_and_resumes_exactly(tmp_path, monkeypatch):
    """The pre-emption warning (submitit's USR2) as the local controller sends it: to its task, which hands it
    to every rank."""
    for key, value in clean_env().items():
        monkeypatch.setenv(key, value)
    job = _submit_local(tmp_path, "preempted")
    run_dir = tmp_path / "preempted"
    wait_for(lambda: steps_logged(run_dir) >= 20, "step 20", alive=lambda: not job.done())
    (task,) = children(int(job.job_id))
    os.kill(task, signal.SIGUSR2)
    result = job.results()[0]
    # No periodic checkpoints were asked for: the one resumed from was written on the signal.
    assert 20 <= result.resumed_from_step < STEPS
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"step-{result.resumed_from_step:06d}"]
    reference = uninterrupted_like(tmp_path / "preempted.json", tmp_path / "reference")
    assert losses(run_dir) == losses(tmp_path / "reference")
    assert result.aggregations == reference.aggregations


SWEEP = ["sweep=smoke", "model=tiny", "sweep.strategies=[fl_fsdp]", f"sweep.train.steps={STEPS}",
         "train.checkpoint_every=10", "sweep.train.log_every=5", "poll_s=0.2"]
RUN_ID = "fl_fsdp-F2-R1-S2-A2"


def _launcher(results: Path, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *SWEEP, f"results_dir={results}"],
                            env=clean_env(slurm_client=False),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    return out


def _manifest(results: Path) -> dict:
    return json.loads((results / "local" / "smoke" / "manifest.jsonl").read_text())


def _kill_launcher_mid_run(results: Path, whole_session: bool) -> None:
    """SIGKILL the launcher (and, with whole_session, its job too, as when a login session dies)."""
    proc = _launcher(results, start_new_session=True)
    run_dir = results / "local" / "smoke" / RUN_ID
    wait_for(lambda: (run_dir / "checkpoints" / "step-000020").exists(), "the step-20 checkpoint",
              alive=lambda: proc.poll() is None)
    if whole_session:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    proc.wait(timeout=60)
    assert not (run_dir / "result.json").exists()
    assert _manifest(results)["state"] in ("SUBMITTED", "RUNNING")  # what a killed launcher leaves behind


@pytest.mark.slow
def test_launcher_killed_rerun_reattaches_or_resumes_with_the_samelosses(tmp_path):
    # The launcher alone dies: its job runs on; the rerun watches that job instead of submitting another.
    _kill_launcher_mid_run(tmp_path / "orphan", whole_session=False)
    job_id = _manifest(tmp_path / "orphan")["job_id"]
    out = _finish(_launcher(tmp_path / "orphan"))
    assert f"reattached {RUN_ID} to job {job_id} (attempt 1)" in out and f"submitted {RUN_ID}" not in out
    run_dir = tmp_path / "orphan" / "local" / "smoke" / RUN_ID
    reference = tmp_path / "reference"  # the same spec, uninterrupted on forked ranks
    uninterrupted_like(run_dir / "spec.json", reference)
    assert RunResult.load(run_dir / "result.json").resumed_from_step == 0
    assert _manifest(tmp_path / "orphan")["state"] == "COMPLETED"
    assert losses(run_dir) == losses(reference)

    # The launcher and its job die together: the rerun finds the job gone and resumes from its checkpoint.
    _kill_launcher_mid_run(tmp_path / "session", whole_session=True)
    out = _finish(_launcher(tmp_path / "session"))
    assert f"reattached {RUN_ID}" in out and f"submitted {RUN_ID}" in out and "(attempt 2)" in out
    run_dir = tmp_path / "session" / "local" / "smoke" / RUN_ID
    assert RunResult.load(run_dir / "result.json").resumed_from_step >= 20
    assert _manifest(tmp_path / "session")["state"] == "COMPLETED"
    assert losses(run_dir) == losses(reference)


@pytest.mark.slow
def test_stop_signal_outside_submitit_saves_and_says_how_to_resume(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"strategy": "fsdp", "F": 1, "R": 1, "S": 1, "out_dir": str(tmp_path / "run"),
                                "train": {"steps": 100000, "seq_len": 16, "log_every": 5, "stop_check_every": 1}}))
    proc = subprocess.Popen([sys.executable, "-m", "train", str(spec)], env=clean_env(), stderr=subprocess.PIPE,
                            text=True)
    wait_for(lambda: steps_logged(tmp_path / "run") >= 10, "step 10", alive=lambda: proc.poll() is None)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    step = int(err.split("after step ")[1].split(";")[0])
    assert err.startswith(f"fedshard: error: stopped by SIGUSR2 after step {step}; a checkpoint")
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == [f"step-{step:06d}"]
    assert steps_logged(tmp_path / "run") == step and not (tmp_path / "run" / "result.json").exists()
