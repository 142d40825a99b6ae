"""Which failures the launcher retries is read from the error line a job's tasks left: srun's own closing line
must not hide the task's exception (a NonFiniteError under srun was retried because of it)."""
from types import SimpleNamespace

from launcher.actions.outcome import failure_reason, retryable
from train.contract import submitit_compat


def test_the_tasks_exception_wins_over_sruns_exit_line(tmp_path):
    job = SimpleNamespace(job_id="7", paths=SimpleNamespace(folder=tmp_path))
    stderr = submitit_compat.task_paths(tmp_path, "7", 0).stderr
    stderr.parent.mkdir(parents=True, exist_ok=True)
    stderr.write_text("Traceback (most recent call last):\n  ...\n"
                      "train.contract.common.NonFiniteError: the loss was not finite at step 2 on rank 0 "
                      "(federation group 0)\n"
                      "srun: error: tb1: task 0: Exited with exit code 1\n")
    reason = failure_reason(job, tasks=1)
    assert reason.startswith("train.contract.common.NonFiniteError:") and not retryable(reason)
    stderr.write_text("srun: error: tb1: task 0: Killed\n")  # nothing but srun's line: a node or task died
    assert retryable(failure_reason(job, tasks=1))
