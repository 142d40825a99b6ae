"""One test per private submitit name that train/contract/submitit_compat.py relies on, against the installed submitit:
if an upgrade renames or changes one, this fails here rather than in a job (pyproject.toml bounds the version)."""
import importlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

from tests.support import wait_for
from train.contract import submitit_compat


def test_preemption_signal_is_usr2_unless_submitit_is_told_otherwise():
    assert submitit_compat.preemption_signal() == signal.SIGUSR2
    code = "from train.contract import submitit_compat; print(int(submitit_compat.preemption_signal()))"
    out = subprocess.run([sys.executable, "-c", code], env={"SUBMITIT_PREEMPT_SIGNAL": "USR1", "PATH": ""},
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == str(int(signal.SIGUSR1)), out.stderr


def test_slurm_parameter_names_include_what_slurm_parameters_sets():
    names = submitit_compat.slurm_parameter_names()
    assert {"job_name", "nodes", "ntasks_per_node", "time", "partition", "setup", "gpus_per_node", "account",
            "qos", "nodelist", "srun_args", "additional_parameters"} <= names


def test_sbatch_script_renders_without_submitting(tmp_path):
    text = submitit_compat.sbatch_script(tmp_path, {"job_name": "x", "nodes": 2, "ntasks_per_node": 4,
                                                    "setup": ["module load cuda"]})
    assert text.startswith("#!/bin/bash") and "#SBATCH --nodes=2" in text and "#SBATCH --job-name=x" in text
    assert f"-m {submitit_compat.SUBMIT_MODULE} {tmp_path}" in text and "module load cuda" in text
    assert not list(tmp_path.iterdir())  # nothing submitted, nothing written


def test_the_modules_submitit_runs_exist():
    for name in (submitit_compat.SUBMIT_MODULE, submitit_compat.LOCAL_CONTROLLER_MODULE):
        assert importlib.util.find_spec(name) is not None, name


def test_the_local_requeue_status_is_submitits():
    from submitit.local import local

    assert submitit_compat.LOCAL_REQUEUE_STATUS == local.LOCAL_REQUEUE_RETURN_CODE


def test_task_paths_name_stderr_and_result_pickle(tmp_path):
    paths = submitit_compat.task_paths(tmp_path / "%j", "42", 3)
    assert paths.stderr.name.startswith("42_3") and paths.stderr.parent == tmp_path / "42"
    assert paths.result_pickle.name.startswith("42_3") and paths.result_pickle.suffix == ".pkl"


@pytest.mark.slow
def test_a_local_job_is_recognised_by_its_controllers_command_line(tmp_path):
    """The command line submitit's LocalExecutor gives a job's controller (checked on a real job)."""
    executor = submitit.LocalExecutor(folder=tmp_path)
    executor.update_parameters(timeout_min=1)
    job = executor.submit(time.sleep, 5)  # still running when its command line is read

    def cmdline() -> list[bytes]:  # empty while the new process is still exec'ing, under load
        return Path(f"/proc/{job.job_id}/cmdline").read_bytes().split(b"\0")

    wait_for(lambda: submitit_compat.is_local_controller(cmdline(), tmp_path), "the controller's command line",
             timeout_s=30, alive=lambda: not job.done())
    assert not submitit_compat.is_local_controller(cmdline(), tmp_path / "other")
    assert job.result() is None
    assert submitit_compat.task_outcome(job.paths.folder, job.job_id, 0) == ("success", None)
    assert submitit_compat.task_outcome(job.paths.folder, "4242", 0) is None
    # launcher.submit.ReattachedLocalJob builds a LocalJob from these three arguments
    assert submitit.LocalJob(folder=tmp_path, job_id=job.job_id, tasks=[0]).job_id == job.job_id


def test_submitit_tells_a_jobs_process_by_its_folder_variable():
    """train.job leaves a submitit task without finalization only where submitit's process_job set this."""
    import inspect

    from submitit.core import submission

    assert f'os.environ["{submitit_compat.JOB_FOLDER_ENV}"]' in inspect.getsource(submission.process_job)
