"""How a job ended, read from what its tasks and its preflight left: which error, and whether another attempt may
pass (action=run retries only those); shared by every action that submits a job."""
from __future__ import annotations

import json
from pathlib import Path

from launcher.placement import health
from train.contract import submitit_compat
from train.contract.common import AlignmentError, DataError, NonFiniteError, SpecError

# Failures that fail the same way on a second try: the job's spec, data or layout is wrong, or its values went
# non-finite (a rerun resumes from the same checkpoint with the same data). Anything else
# (a node failure, pre-emption, a timeout, a rendezvous that did not come up, a killed task) is retried.
DETERMINISTIC = tuple(cls.__name__ for cls in (SpecError, DataError, AlignmentError, NonFiniteError))
# SLURM ended the job because a node failed: whatever the surviving tasks wrote, another attempt may pass
NODE_FAILURE = "node failure (SLURM: NODE_FAIL)"
# A job SLURM preempted (PREEMPTED: PreemptMode=CANCEL, or a requeue that did not happen) is resubmitted to resume
# from its checkpoint; it is neither a failure nor a retry. Past this many in one invocation it counts as a failure.
MAX_PREEMPTIONS = 10


def retryable(reason: str) -> bool:
    """Whether a failed run may pass on another attempt, from the error line its tasks left (and a node failure's
    name, which the launcher puts before it)."""
    return NODE_FAILURE in reason or not any(f"{name}:" in reason for name in DETERMINISTIC)


def failure_reason(job, tasks: int) -> str:
    """The last error line the job's tasks wrote (read from their logs: asking submitit would wait on sacct); in a
    local job, its task's verdict (train.job.forked_ranks.RankError), which names the rank that failed first and its
    error line: the other ranks' errors follow from that one and may be written after it."""
    for task in range(tasks):
        try:
            text = submitit_compat.task_paths(job.paths.folder, job.job_id, task).stderr.read_text(errors="replace")
        except OSError:
            continue
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        # srun's own "srun: error: ... Exited with exit code 1" follows the task's exception: it says only that
        # the task failed, and would hide which error (and so whether a retry can pass)
        errors = [line for line in lines if ("fedshard: error" in line or "Error" in line or "error:" in line)
                  and not line.startswith("srun: ")]
        verdict = [line for line in errors if "RankError: " in line]
        if errors:
            return (verdict or errors)[-1][:300]
    return "no result.json (see the submitit logs)"


class OneJob:
    """A run's one job, asked what a fault-tolerant run's GroupJobs is asked (launcher.actions.groups): whether it
    ended and its state, where it runs, why it failed; so action=run watches both alike."""

    def __init__(self, scheduler, job, tasks: int):
        self.scheduler, self.job, self.tasks = scheduler, job, tasks

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def state(self, polled: dict | None) -> tuple[bool, str]:
        return self.scheduler.done(self.job, self.tasks, polled)

    def nodes(self) -> list[str] | None:
        return self.scheduler.nodes(self.job)

    @property
    def failure(self) -> str:
        return failure_reason(self.job, self.tasks)

    def cancel(self, check: bool = True) -> None:
        self.job.cancel(check=check)


def preflight_named(run_dir: Path) -> list[str]:
    """The nodes the run's last job's preflight named (launcher.placement.injob.PreflightedJob), none without."""
    path = run_dir / health.FILE
    try:
        return list(json.loads(path.read_text())["exclude"])
    except (OSError, ValueError, KeyError):
        return []
