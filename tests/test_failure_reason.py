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


def test_a_local_jobs_verdict_wins_over_the_errors_that_followed_it(tmp_path):
    """A local job's task names the rank that failed first (train.job.forked_ranks); the others' errors (gloo's lost
    peer) follow from it, and rank 0's may land in the task's log after the verdict."""
    job = SimpleNamespace(job_id="8", paths=SimpleNamespace(folder=tmp_path))
    stderr = submitit_compat.task_paths(tmp_path, "8", 0).stderr
    stderr.parent.mkdir(parents=True, exist_ok=True)
    verdict = ("train.job.forked_ranks.RankError: rank 2 of 4 was ended by SIGKILL: fedshard: rank 2 of federation "
               "group 1 killed after step 6 (train.fault_step)")
    lost_peer = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:39583."
    stderr.write_text(f"submitit ERROR - Submitted job triggered an exception\n{verdict}\n{lost_peer}\n")
    assert failure_reason(job, tasks=1) == verdict and retryable(verdict)
    deterministic = ("train.job.forked_ranks.RankError: rank 1 of 4 exited with status 1: "
                     "train.contract.common.DataError: shard 3 ended early")
    stderr.write_text(f"{deterministic}\n{lost_peer}\n")
    assert failure_reason(job, tasks=1) == deterministic and not retryable(deterministic)
