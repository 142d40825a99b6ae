"""train.fault_step / train.fault_group (issue 56): one federation group's ranks die after a given step of the run's
first attempt, the same step every time; the retry resumes from the last checkpoint and trains through that step.
tests/test_testbed.py injects the same fault on SLURM, where the group's node is set DOWN with it."""
import json
import re
import statistics
import subprocess
import sys

import pytest

from tests.support import ROOT, clean_env, losses, uninterrupted_like
from train.contract.common import SpecError
from train.contract.result import RunResult
from train.contract.spec import RunSpec
from train.runtime.fault import MARK, Fault

RUN = "fl_fsdp-F2-R1-S2-A2"


def _spec(**train) -> RunSpec:
    return RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 2, "out_dir": "/nonexistent",
                              "train": {"steps": 12, **train}})


def test_the_fault_arms_the_ranks_of_its_group_until_the_run_directory_records_it(tmp_path):
    spec = _spec(fault_step=6, fault_group=1)
    assert [Fault.armed(spec, rank, tmp_path) is not None for rank in range(4)] == [False, False, True, True]
    assert Fault.armed(spec, 2, None) is None  # no run directory (tests, benchmarks): nothing to record it in
    assert Fault.armed(_spec(), 2, tmp_path) is None
    (tmp_path / MARK).write_text(json.dumps({"step": 6, "group": 1}))
    assert Fault.armed(spec, 2, tmp_path) is None  # struck already: a later attempt trains through step 6


def test_a_fault_past_the_last_step_or_outside_the_groups_is_refused():
    with pytest.raises(SpecError, match="train.fault_step=12 must be below train.steps=12"):
        _spec(fault_step=12)
    with pytest.raises(SpecError, match=f"train.fault_group=2 names no federation group of {RUN}"):
        _spec(fault_step=6, fault_group=2)


@pytest.mark.slow
def test_a_group_killed_after_a_step_is_retried_from_its_checkpoint_with_the_same_losses(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "sweep.strategies=[fl_fsdp]",
                           "sweep.train.steps=12", "train.checkpoint_every=4", "train.fault_step=6",
                           "train.fault_group=1", "retries=1", f"results_dir={tmp_path / 'results'}"],
                          capture_output=True, text=True, cwd=ROOT, env=clean_env(slurm_client=False), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = tmp_path / "results" / "local" / "smoke"
    failed = next(line for line in proc.stdout.splitlines() if f"{RUN}: FAILED" in line)
    assert re.search(r"rank [23] of 4 was ended by SIGKILL", failed), failed  # group 1 holds ranks 2 and 3
    assert "retrying 1 failed run(s)" in proc.stdout
    entry = json.loads((sweep / "manifest.jsonl").read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2, entry
    run_dir = sweep / RUN
    fault = json.loads((run_dir / MARK).read_text())
    assert (fault["step"], fault["group"]) == (6, 1)
    result = RunResult.load(run_dir / "result.json")
    assert result.resumed_from_step == 4  # the checkpoint before the fault
    assert {k: result.fault[k] for k in ("step", "group", "resumed_from_step", "steps_retrained")} == \
        {"step": 6, "group": 1, "resumed_from_step": 4, "steps_retrained": 2}
    assert result.fault["tokens_retrained"] == 2 * result.tokens // 12 and result.fault["fault_to_resume_s"] > 0
    table = (sweep / "table3.md").read_text()
    assert "| (2,1,2) † |" in table and f"† {RUN}: federation group 1 killed after step 6" in table, table
    # the same run trained uninterrupted on forked ranks, with no fault: the retry's losses are its losses
    uninterrupted_like(run_dir / "spec.json", tmp_path / "reference")
    assert losses(run_dir) == losses(tmp_path / "reference")


@pytest.mark.slow
def test_a_slowed_group_slows_the_steps_that_wait_for_it(tmp_path):
    """fault_kind=slow: from step 8 group 1's ranks run a quarter of each 100 ms (train.runtime.throttle); with an
    average every 2 steps every step waits for them, so the steps after the fault are far slower than before it
    (about 3x here; the check asks 1.5x, a margin against a busy machine, not a target)."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "sweep.strategies=[fl_fsdp]",
                           "sweep.train.steps=20", "train.fault_step=8", "train.fault_group=1",
                           "train.fault_kind=slow", "train.fault_speed=0.25", f"results_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=ROOT, env=clean_env(slurm_client=False), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = tmp_path / "local" / "smoke"
    result = RunResult.load(sweep / RUN / "result.json")
    assert {k: v for k, v in result.fault.items() if k != "at"} == \
        {"kind": "slow", "step": 8, "group": 1, "speed": 0.25}
    times = {row["step"]: row["step_time"] for row in map(json.loads, (sweep / RUN / "metrics.jsonl").open())}
    before = statistics.median(times[s] for s in range(3, 9))
    after = statistics.median(times[s] for s in range(11, 21))
    print(f"median step before the fault {before * 1e3:.1f} ms, after {after * 1e3:.1f} ms")
    assert after > 1.5 * before, (before, after)
    assert f"† {RUN}: federation group 1 ran at 0.25 of its speed from step 8" in (sweep / "table3.md").read_text()
