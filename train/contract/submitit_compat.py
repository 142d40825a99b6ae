"""Every use of submitit's private API, in one place (tests/test_submitit_compat.py checks each name
against the installed submitit; pyproject.toml bounds the version those tests passed with).

submitit has no public way to render an sbatch script without submitting, to list the sbatch
parameters it accepts, to name the signal it treats as pre-emption, to recognise a local job's
controller process, to read a task's pickled outcome, or to tell that this process runs a job's callable;
fedshard needs all six. It lives in train/ because the trainer needs the signal
and train/ never imports the launcher.
"""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

SUBMIT_MODULE = "submitit.core._submit"          # what a submitit sbatch script runs on the nodes
JOB_FOLDER_ENV = "SUBMITIT_FOLDER"  # set by submitit's process_job in the process that runs a job's callable
LOCAL_CONTROLLER_MODULE = "submitit.local._local"  # the process that runs a LocalExecutor job's tasks
LOCAL_REQUEUE_STATUS = 144  # a local task's exit status asking its controller to start it again (pre-emption)


def preemption_signal() -> int:
    """The signal submitit treats as pre-emption (SIGUSR2, or SUBMITIT_PREEMPT_SIGNAL)."""
    from submitit import JobEnvironment

    return JobEnvironment._usr_sig()


def slurm_parameter_names() -> set[str]:
    """The sbatch parameters SlurmExecutor accepts by name (others go to additional_parameters)."""
    import submitit

    return set(submitit.SlurmExecutor._valid_parameters())


def sbatch_script(folder: Path, parameters: dict, python: str | None = None) -> str:
    """The script SlurmExecutor(python=python) would submit with these parameters, without submitting it."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = shlex.join([python or sys.executable, "-u", "-m", SUBMIT_MODULE, str(folder)])
    return _make_sbatch_string(command=command, folder=folder, **parameters)


def task_paths(folder: Path, job_id: str, task: int):
    """submitit's JobPaths of one task: its stderr and result pickle."""
    from submitit.core.utils import JobPaths

    return JobPaths(folder, job_id, task)


def task_outcome(folder: Path, job_id: str, task: int) -> tuple[str, object] | None:
    """What a finished task pickled: ("success", its return value) or ("error", the traceback's text); None
    while there is nothing (the task runs, or died before it could write)."""
    from submitit.core.utils import pickle_load

    path = task_paths(folder, job_id, task).result_pickle
    return pickle_load(path) if path.exists() else None


def in_job() -> bool:
    """Whether this process is a submitit task running a job's callable (it exits when the callable returns)."""
    return JOB_FOLDER_ENV in os.environ


def is_local_controller(cmdline: list[bytes], folder: Path) -> bool:
    """Whether a process command line is the LocalExecutor controller of the job in `folder`."""
    return LOCAL_CONTROLLER_MODULE.encode() in cmdline and str(folder).encode() in cmdline
