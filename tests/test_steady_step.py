"""result.json's steady_step_s (issue 54, item 4): the step the step-time model predicts, without the first two
steps' communicator set-up and warm-up, over whole aggregation periods."""
import pytest

from train.measure.metrics import StepLog


def _log(elapsed: list[float]) -> StepLog:
    log = StepLog(None, 1, "cpu")
    log.rows = [{"step": i + 1, "elapsed_s": t} for i, t in enumerate(elapsed)]
    return log


def test_the_steady_step_leaves_out_the_first_two_and_keeps_whole_periods():
    # step 1 takes 1 s (communicators), step 2 0.3 s, then 0.1 s a step and 0.5 s more at every 4th (a FedAvg)
    elapsed, t = [], 0.0
    for step in range(1, 18):
        t += {1: 1.0, 2: 0.3}.get(step, 0.1 + (0.5 if step % 4 == 0 else 0.0))
        elapsed.append(t)
    steady, steps = _log(elapsed).steady_step(None)  # FSDP: every step after the second
    assert steps == 15 and steady == pytest.approx((15 * 0.1 + 4 * 0.5) / 15)
    steady, steps = _log(elapsed).steady_step(4)  # A = 4: steps 6..17, three whole periods, a FedAvg each
    assert steps == 12 and steady == pytest.approx(0.1 + 0.5 / 4)
    assert _log(elapsed[:2]).steady_step(None) is None and _log([]).steady_step(None) is None
    assert _log(elapsed[:5]).steady_step(4) is None  # 3 steps after the second: no whole period of 4
