"""submitit executors with per-run resources, the sbatch text for plans, and job-state polling.

cluster=local: one submitit LocalExecutor job per run whose tasks are the ranks.
SLURM clusters: nodes x (tasks per node = GPUs per node), partition/account/qos/time,
setup lines and extra sbatch parameters from the cluster config. submitit learns job
state only from sacct; where accounting is absent it would wait forever for a job
killed outside Python, so we fall back to squeue / scontrol (with a timeout).
"""
from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import submitit

from launcher.errors import SubmitError
from launcher.settings import Cluster
from launcher.slurm import scontrol
from launcher.slurm.hostlist import compress
from launcher.slurm.injob import PlacedTrainJob
from launcher.sweep import PlannedRun, Run
from train import submitit_compat
from train.job import TrainJob
from train.spec import write_atomic


def attempt_folder(run_dir: Path, attempt: int) -> Path:
    """A submitit folder per attempt: job ids restart on a fresh cluster and must not meet stale outputs."""
    return run_dir / "submitit" / f"attempt{attempt}"


def hostfile_path(run: Run) -> Path:
    return Path(run.spec.out_dir) / "hostfile"


def slurm_parameters(cluster: Cluster, planned: PlannedRun) -> dict:
    """submitit SlurmExecutor parameters (names as sbatch's, underscores for dashes).

    pinned: the planned nodes (--nodelist) and, since an ordered nodelist does not order ranks,
    a hostfile with `srun --distribution=arbitrary`. in_job: only --nodes, and --switches or --segment
    as the plan asks (plan.topology_request); ranks are ordered at job start by PlacedTrainJob.
    """
    run = planned.run
    params = {"job_name": run.run_id, "nodes": run.nodes, "ntasks_per_node": cluster.gpus_per_node,
              "time": cluster.time_min, "partition": cluster.partition, "setup": list(cluster.setup)}
    extra = dict(cluster.sbatch_extra)
    if cluster.placement == "pinned":
        params["nodelist"] = compress(planned.placement.nodes)
        params["srun_args"] = ["--distribution=arbitrary"]
        params["setup"].append(f"export SLURM_HOSTFILE={shlex.quote(str(hostfile_path(run)))}")
    else:
        extra = {**planned.topology_request, **extra}
    if cluster.device == "cuda":
        params["gpus_per_node"] = cluster.gpus_per_node
    for key in ("account", "qos", "cpus_per_task", "mem"):
        if getattr(cluster, key) not in (None, ""):
            params[key] = str(cluster.mem) if key == "mem" else getattr(cluster, key)
    known = submitit_compat.slurm_parameter_names()
    params.update({k: extra.pop(k) for k in list(extra) if k in known})
    if extra:
        params["additional_parameters"] = extra
    return params


def sbatch_text(cluster: Cluster, planned: PlannedRun, folder: Path) -> str:
    """The script submitit would submit for this run (shown by action=plan)."""
    return submitit_compat.sbatch_script(folder, slurm_parameters(cluster, planned), cluster.python)


def resources(cluster: Cluster, planned: PlannedRun) -> dict:
    if cluster.executor == "local":
        return {"executor": "local", "tasks": planned.run.spec.world_size, "timeout_min": cluster.time_min}
    return {"executor": "slurm", **slurm_parameters(cluster, planned)}


def require_netns(cluster: Cluster) -> None:
    """Clusters reachable only from a network namespace (the testbed) refuse clients started elsewhere."""
    if not cluster.netns:
        return
    target = Path("/run/netns") / cluster.netns
    if not target.exists() or os.stat("/proc/self/ns/net").st_ino != os.stat(target).st_ino:
        raise SubmitError(f"cluster {cluster.name!r} must be used from network namespace {cluster.netns}: "
                          f"run `slurm/testbed/lab python -m launcher ...` (is the testbed up?)")


def check_environment(cluster: Cluster) -> None:
    """Refuse before submitting anything when the scheduler's client is missing."""
    require_netns(cluster)
    if cluster.executor == "slurm":
        for tool in ("sbatch", "srun"):
            if shutil.which(tool) is None:
                raise SubmitError(f"cluster {cluster.name!r} uses SLURM but `{tool}` is not on PATH "
                                  f"(run on a login node, or use cluster=local)")


def make_executor(cluster: Cluster, planned: PlannedRun, folder: Path):
    if cluster.executor == "local":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(tasks_per_node=planned.run.spec.world_size, nodes=1, timeout_min=cluster.time_min)
        return executor
    executor = submitit.SlurmExecutor(folder=folder, python=cluster.python)
    executor.update_parameters(**slurm_parameters(cluster, planned))
    return executor


def entrypoint(cluster: Cluster, planned: PlannedRun, spec_path: Path, topology_path: Path) -> TrainJob:
    """What every task runs: ranks reordered at job start when placed by topology on a known tree (in_job),
    else the scheduler's rank (pinned: its hostfile orders them; slurm: SLURM's own order is the point)."""
    if cluster.executor == "slurm" and cluster.placement == "in_job" and planned.leaves:
        return PlacedTrainJob(str(spec_path), str(topology_path), cluster.gpus_per_node)
    return TrainJob(str(spec_path))


def submit(cluster: Cluster, planned: PlannedRun, spec_path: Path, folder: Path, topology_path: Path):
    """Submit one run; a pinned run's hostfile is written (atomically) before its job exists."""
    if cluster.executor == "slurm" and cluster.placement == "pinned":
        write_atomic(hostfile_path(planned.run), planned.placement.hostfile())
    executor, job = make_executor(cluster, planned, folder), entrypoint(cluster, planned, spec_path, topology_path)
    return submit_job(cluster, executor, job, planned.run.run_id, folder)


def submit_job(cluster: Cluster, executor, job, name: str, folder: Path):
    """executor.submit(job): a local controller's stderr goes to its log; sbatch is tried again only when
    slurmctld was busy or away (SBATCH_TRANSIENT), any other refusal is one line naming `name`."""
    if cluster.executor == "local":
        with _stderr_into(folder / "controller.log"):
            return executor.submit(job)
    for attempt in range(1, SBATCH_TRIES + 1):
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr, then raises it
                return executor.submit(job)
        except submitit.core.utils.FailedJobError as exc:
            message = next((line.strip() for line in str(exc).splitlines() if line.strip()), "no message")
            if attempt == SBATCH_TRIES or not any(t in message for t in SBATCH_TRANSIENT):
                raise SubmitError(f"sbatch refused {name}: {message}") from None
            print(f"sbatch: {message}; trying again in {SBATCH_WAIT_S:g} s ({attempt}/{SBATCH_TRIES})", flush=True)
            time.sleep(SBATCH_WAIT_S)


SBATCH_TRIES, SBATCH_WAIT_S = 3, 5.0
# sbatch's answers when slurmctld is busy or briefly away: another try may pass; anything else (a wrong
# partition, account or QOS, a limit) would fail the same way and is the user's to fix
SBATCH_TRANSIENT = ("temporarily unavailable", "Socket timed out", "Unable to contact slurm controller",
                    "Slurm temporarily unable")


@contextlib.contextmanager
def _stderr_into(path: Path):
    """Point this process's stderr (fd 2) at `path` while submitit starts a local controller, which inherits it:
    the controller's traceback when Ctrl-C or a cancel interrupts it lands in its log, not on the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class ReattachedLocalJob(submitit.LocalJob):
    """A local job whose launcher was killed: its controller outlived it, but is no longer our child.

    It runs while /proc/PID is that controller's command line for this folder (a pid reused by
    another program, or a zombie, has another or an empty command line).
    """

    def _alive(self) -> bool:
        try:
            cmdline = Path(f"/proc/{int(self.job_id)}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return False
        return submitit_compat.is_local_controller(cmdline, self.paths.folder)

    def get_info(self, mode: str = "force") -> dict:
        return {"jobState": "RUNNING" if self._alive() else "FINISHED"}

    def cancel(self, check: bool = True) -> None:
        if self._alive():
            os.kill(int(self.job_id), signal.SIGINT)  # the controller stops its tasks


def reattach(cluster: Cluster, run: Run, folder: Path, job_id: str):
    """The job an earlier launcher submitted for this run, to be watched instead of submitted again."""
    job_class = ReattachedLocalJob if cluster.executor == "local" else submitit.SlurmJob
    return job_class(folder=folder, job_id=job_id, tasks=list(range(run.spec.world_size)))


def has_accounting(cluster: Cluster) -> bool:
    """Whether job states can come from sacct, submitit's only source (the local executor needs none)."""
    return cluster.executor != "slurm" or scontrol.accounting_enabled()


def task_lines(job, prefix: str, stream: str = "stdout") -> list[str]:
    """The lines task 0 of `job` wrote to `stream` that start with `prefix` (its progress); [] before any."""
    paths = submitit_compat.task_paths(job.paths.folder, job.job_id, 0)
    try:
        text = getattr(paths, stream).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.startswith(prefix)]


def wait_for(job, cluster: Cluster, tasks: int, poll_s: float, after_poll=lambda state: None) -> str:
    """Poll one job (the probe, a preparation) until it ends; `after_poll(state)` after every poll, the last one
    included, echoes its progress. Returns its final state."""
    accounting = has_accounting(cluster)
    while True:
        done, state = job_done(job, cluster.executor, tasks, accounting)
        after_poll(state)
        if done:
            return state
        time.sleep(poll_s)


FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE")


def job_done(job, executor_kind: str, tasks: int, accounting: bool = True,
             slurm_states: dict[str, str | None] | None = None) -> tuple[bool, str]:
    """(done, state). With accounting, sacct says a cancelled job ended while its tasks may still run for
    KillWait seconds (squeue: COMPLETING): it is done only once they are gone, so a retry never meets them in
    the run directory. Without accounting submitit (which asks only sacct) is bypassed: a job is done when
    every task left its result pickle, or when squeue/scontrol say it ended (or no longer know it).
    `slurm_states`: this poll's scontrol.job_states of every running job (asked here when absent)."""
    job_id = str(job.job_id)
    if executor_kind == "slurm" and slurm_states is None:
        slurm_states = scontrol.job_states([job_id])
    if executor_kind != "slurm" or accounting:
        if job.done():
            # squeue was asked at the start of this poll: unless it already saw the job end (or forgot it),
            # tasks may still run (COMPLETING after a cancel, or a cancel between the two queries).
            if executor_kind == "slurm" and slurm_states.get(job_id) not in (None, *FINAL_STATES):
                return False, slurm_states[job_id]
            return True, job.state
        if executor_kind != "slurm" or job.state not in ("UNKNOWN", "NODE_FAIL"):
            return False, job.state
    elif all(submitit_compat.task_paths(job.paths.folder, job.job_id, task).result_pickle.exists()
             for task in range(tasks)):
        return True, "COMPLETED"
    state = slurm_states.get(job_id)
    if state is None or state in FINAL_STATES:
        return True, state or "VANISHED"
    return False, state
