"""`TrainJob(spec_path)`: the training entrypoint as a picklable callable, for submitit (the launcher submits
it; `python -m train SPEC.json` calls it too)."""
from __future__ import annotations

import atexit
import os
import sys

from train.result import RunResult
from train.runtime import submitit_compat
from train.spec import RunSpec


def leave_without_finalization(code: int) -> None:
    """End the process now, its output flushed. Once a run has written everything, nothing is left to do, and
    interpreter finalization can abort it: torch keeps the FSDP2 meshes' gloo groups in DTensor's caches past
    destroy_process_group, and freeing them during finalization, a gloo worker thread that needs the GIL ends
    the process with "terminate called without an active exception" (SIGABRT), a finished run failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_after_the_job() -> None:
    """atexit in a submitit task whose callable returned: submitit has pickled the result, so leave with status
    0 before finalization; unless an uncaught exception is ending the process (then its status stands)."""
    if getattr(sys, "last_value", None) is None:
        leave_without_finalization(0)


def leave_when_the_task_ends() -> None:
    """Called by a job's callable (training, the probe) once its gloo groups are done with: in a submitit
    task, which ends when the callable returns, that end skips interpreter finalization."""
    if submitit_compat.in_job():
        atexit.register(_leave_after_the_job)


class TrainJob:
    """Picklable for submitit: each task of the job runs one rank."""

    PRELOAD = ("train.loop",)  # what its ranks import (train.runtime.forked_ranks imports it once, before forking them)

    def __init__(self, spec_path: str):
        self.spec_path = str(spec_path)

    def __call__(self) -> RunResult | None:
        spec = RunSpec.load(self.spec_path)  # a bad spec fails before torch is even imported
        from train.loop import run

        result = run(spec)
        leave_when_the_task_ends()
        return result

    def checkpoint(self, *args, **kwargs):
        """submitit calls this when the job is preempted or reaches its time limit: requeue the same job,
        which resumes from the latest checkpoint in the run directory (train.checkpoint_every)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)
