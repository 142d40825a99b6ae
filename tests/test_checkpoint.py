"""Exact resume: a run killed mid-way and started again gives the losses of an uninterrupted run."""
import json
from pathlib import Path

import pytest

from tests import forked
from tests.support import clean_env, losses, uninterrupted
from train.contract.result import RunResult

STEPS, EVERY = 120, 20


def _spec(tmp_path: Path, name: str, **over) -> Path:
    spec = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 3, "out_dir": str(tmp_path / name),
            "train": {"steps": STEPS, "seq_len": 16, "log_every": 5, "checkpoint_every": EVERY}}
    spec.update(over)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _torchrun(spec: Path, entry=("train",)) -> forked.Ranks:
    """`torchrun --nproc_per_node 4 -m ENTRY... SPEC` on ranks forked from a preloaded interpreter (tests/forked.py)."""
    return forked.torchrun(*entry, str(spec), nproc=4, env=clean_env())


@pytest.mark.slow
def test_rank_sigkilled_while_writing_a_checkpoint_then_rerun_resumes_exactly(tmp_path):
    uninterrupted(json.loads(_spec(tmp_path, "reference").read_text()))

    spec = _spec(tmp_path, "killed")
    run_dir = tmp_path / "killed"
    # Checkpoints asked for every 20 steps are taken at the next FedAvg (A=3): steps 21, 42, 60, ...
    # Rank 1 dies by SIGKILL halfway through writing the step-60 checkpoint; torchrun ends the others.
    first = _torchrun(spec, entry=["tests.crash_in_checkpoint", str(EVERY * 3), "1"])
    assert first.wait(timeout=600) != 0
    assert not (run_dir / "result.json").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        [".step-000060.tmp", "step-000021", "step-000042"]  # the interrupted write was never published
    assert len(losses(run_dir)) == EVERY * 3

    second = _torchrun(spec)
    assert second.wait(timeout=600) == 0, second.stderr[-2000:]
    result = RunResult.load(run_dir / "result.json")
    assert result.resumed_from_step == 42  # the previous checkpoint loaded
    assert losses(run_dir) == losses(tmp_path / "reference")  # bitwise: same losses, same FedAvg steps
    reference_result = RunResult.load(tmp_path / "reference" / "result.json")
    assert result.aggregations == reference_result.aggregations
    # The result covers the whole run, the first attempt's 42 steps included, on one clock.
    assert result.tokens == reference_result.tokens
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # 42 of 120 steps would be 35 % short; each row is a max over ranks, which no barrier aligns: their sum runs
    # ahead of the wall clock by the ranks' skew
    assert result.train_time_s >= 0.8 * sum(r["step_time"] for r in rows)
    assert all(a["elapsed_s"] < b["elapsed_s"] for a, b in zip(rows, rows[1:]))

    # The last step was checkpointed: a restart after it (pre-empted while evaluating) trains nothing again.
    (run_dir / "result.json").unlink()
    third = _torchrun(spec)
    assert third.wait(timeout=600) == 0, third.stderr[-2000:]
    again = RunResult.load(run_dir / "result.json")
    assert again.resumed_from_step == STEPS and losses(run_dir) == losses(tmp_path / "reference")
    assert again.eval_ppl == pytest.approx(result.eval_ppl, rel=1e-9)
    assert again.train_time_s == pytest.approx(result.train_time_s, rel=0.05)  # nothing trained, nothing added


def test_resuming_with_another_layout_or_spec_is_refused(tmp_path):
    uninterrupted(json.loads(_spec(tmp_path, "run", train={"steps": 4, "seq_len": 16, "checkpoint_every": 2})
                             .read_text()))
    # The run finished (result.json) but its checkpoints remain: a different layout must not load them.
    other = _spec(tmp_path, "run", strategy="fl_fsdp", F=4, R=1, S=1, train={"steps": 4, "seq_len": 16})
    proc = _torchrun(other)
    assert proc.wait(timeout=600) != 0 and "resuming with another layout needs train.elastic=true" in proc.stderr
    # Same layout, another experiment: a changed `steps` would resume on the old LR schedule.
    longer = _spec(tmp_path, "run", train={"steps": 6, "seq_len": 16, "checkpoint_every": 3})
    proc = _torchrun(longer)
    assert proc.wait(timeout=600) != 0 and "was written by another spec (train.steps: 4 -> 6)" in proc.stderr, \
        proc.stderr[-2000:]


def _guard_calls_around_resume(rank: int, world: int, out_dir: str) -> tuple[list, list]:
    import train.federation.federated as federated
    from train.contract.spec import RunSpec
    from train.loop import Trainer

    calls = []
    real_check = federated.alignment.check
    federated.alignment.check = lambda *a, **kw: (calls.append(a[-1]), real_check(*a, **kw))[1]
    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 2, "out_dir": out_dir,
                              "train": {"steps": 8, "seq_len": 16}})
    first = Trainer(spec, rank, "cpu", out_dir=Path(out_dir))
    first.restore()
    for i in range(3):
        first.step(i)
    first.checkpointer.save(first.model, first.optimizer, first.state)
    before = list(calls)
    calls.clear()
    resumed = Trainer(spec, rank, "cpu", out_dir=Path(out_dir))
    resumed.restore()
    assert resumed.start_step == 3 and calls == []  # groups differ now: no content check at start
    for i in range(3, 8):
        resumed.step(i)
    return before, list(calls)


def test_alignment_guard_runs_again_before_the_first_average_after_resume(tmp_path):
    from tests.support import run_ranks

    for before, after in run_ranks(_guard_calls_around_resume, 2, str(tmp_path)):
        assert before == [True]   # a fresh run checks layouts and initial contents once, at start
        assert after == [False]   # a resumed one checks layouts once, at its first FedAvg (step 4), not again


SLOW_SAVE_S = 2.0


def _run_with_slow_checkpoints(rank: int, world: int, out_dir: str) -> dict:
    import time

    import train.runtime.checkpoint as checkpoint
    from train.contract.spec import RunSpec
    from train.loop import Trainer

    real_save = checkpoint.Checkpointer.save
    checkpoint.Checkpointer.save = lambda *args: (time.sleep(SLOW_SAVE_S), real_save(*args))[1]
    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 2, "out_dir": out_dir,
                              "train": {"steps": 8, "seq_len": 16, "checkpoint_every": 1, "log_every": 1}})
    trainer = Trainer(spec, rank, "cpu", out_dir=Path(out_dir))
    result = trainer.run("gloo")
    return None if result is None else {**result.to_dict(), "step_times": [r["step_time"] for r in trainer.log.rows]}


@pytest.mark.slow
def test_checkpoint_time_is_kept_out_of_training_time(tmp_path):
    """Checkpoints (asked for every step, taken at each FedAvg: steps 2, 4, 6, and after the last step, 8) each
    take >= 2 s longer than usual; training time must not grow by them. The margin (half the injected 6 s of
    the three inside the loop) is not a speed target."""
    from tests.support import run_ranks

    result = run_ranks(_run_with_slow_checkpoints, 2, str(tmp_path))[0]
    assert result["checkpoints"] == 4
    assert result["checkpoint_s"] >= 4 * SLOW_SAVE_S
    assert result["train_time_s"] < sum(result["step_times"]) + 3 * SLOW_SAVE_S / 2
    assert result["logging_s"] > 0  # metrics flushed every step, timed apart too
