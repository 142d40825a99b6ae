"""How a job's process ends once its work is written: without interpreter finalization, which can abort a finished
run (torch keeps gloo groups alive in caches past destroy_process_group). Torch-free: the job entry point the
launcher imports uses it."""
from __future__ import annotations

import atexit
import os
import sys

from train.contract import submitit_compat


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
