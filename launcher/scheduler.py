"""Where jobs run, decided once from the cluster: `Local` (submitit's LocalExecutor, every rank on this machine,
forked by the job's one task) or `Slurm` (sbatch through submitit). Both answer the same few questions (submit,
poll, done, cancel, nodes, lost nodes, and what the plan shows), so the rest of the launcher never asks which one
it has: `of(cluster)`.

submitit learns a SLURM job's state only from sacct; where accounting is absent it would wait forever for a job
killed outside Python, so `Slurm` falls back to squeue / scontrol (with a timeout)."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import submitit

from launcher.placement import topology
from launcher.placement.injob import PlacedTrainJob, PreflightedJob
from launcher.placement.topology import Topology
from launcher.settings import Cluster
from launcher.slurm import jobenv, scontrol
from launcher.submit import hostfile_path, require_netns, sbatch_text, slurm_parameters
from launcher.sweep import PlannedRun
from train.contract import submitit_compat
from train.contract.common import ConfigError, SubmitError, write_atomic
from train.job import TrainJob
from train.job.forked_ranks import ForkedRanks

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                "BOOT_FAIL", "DEADLINE")
SBATCH_TRIES, SBATCH_WAIT_S = 3, 5.0
# sbatch's answers when slurmctld is busy or briefly away: another try may pass; anything else (a wrong
# partition, account or QOS, a limit) would fail the same way and is the user's to fix
SBATCH_TRANSIENT = ("temporarily unavailable", "Socket timed out", "Unable to contact slurm controller",
                    "Slurm temporarily unable")
LOCAL_POLL_S = 0.25


class Scheduler:
    """What the launcher asks of wherever its jobs run."""

    runs_here = False       # every rank on this machine: its memory is the devices', its runs go one at a time
    reads_topology = False  # the cluster's own topology (a snapshot or live scontrol) places the ranks

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def poll_interval(self, poll_s: float) -> float:
        """Seconds between polls while waiting: poll_s, which spares a shared scheduler (slurmctld)."""
        return poll_s

    @property
    def sequential(self) -> bool:
        """Runs go one at a time: local runs share this machine's cores, and `sequential` clusters ask for it."""
        return self.runs_here or self.cluster.sequential

    def check_environment(self) -> None:
        """Refuse before submitting anything when the scheduler's client is missing."""
        require_netns(self.cluster)

    def topology(self) -> tuple[Topology, str, bool]:
        """The cluster's topology with bandwidth, where it came from, and whether it is the cluster's own."""
        raise NotImplementedError

    def job_environment(self, results_dir: Path) -> list[str]:
        """The plan's words on what a job takes from this machine (its interpreter, a shared results_dir)."""
        return []

    def resources(self, planned: PlannedRun) -> dict:
        raise NotImplementedError

    def script(self, planned: PlannedRun, folder: Path) -> str | None:
        """The batch script a run would be submitted with, for the plan (None: there is none)."""
        return None

    def executor(self, planned: PlannedRun, folder: Path):
        raise NotImplementedError

    def cpu_executor(self, folder: Path, name: str, cpus: int, time_min: int, partition: str | None):
        """An executor for one CPU task (action=prepare)."""
        raise NotImplementedError

    def entrypoint(self, planned: PlannedRun, spec_path: Path, topology_path: Path) -> TrainJob:
        """What every task runs: the scheduler's rank order (placement by topology reorders it: Slurm)."""
        return TrainJob(str(spec_path))

    def submit(self, planned: PlannedRun, spec_path: Path, folder: Path, topology_path: Path,
               preflight: tuple[int, int, float] | None = None):
        """`preflight`: (bytes, iterations, fraction) when the job checks its nodes before training
        (cluster.preflight: launcher.placement.injob.PreflightedJob)."""
        job = self.entrypoint(planned, spec_path, topology_path)
        if preflight is not None:
            job = PreflightedJob(job, str(topology_path), planned.placement.hosts, self.cluster.device,
                                 self.cluster.backend, preflight)
        return self.submit_job(self.executor(planned, folder), job, planned.run.run_id, folder)

    def submit_job(self, executor, job, name: str, folder: Path):
        raise NotImplementedError

    def reattach(self, tasks: int, folder: Path, job_id: str):
        """The job of `tasks` tasks an earlier launcher submitted for a run, to be watched instead of submitted
        again."""
        raise NotImplementedError

    def poll(self, job_ids: list[str]) -> dict[str, str | None] | None:
        """What one poll learns of every running job at once (Slurm: one squeue call), passed to `done`."""
        return None

    def done(self, job, tasks: int, polled: dict | None = None) -> tuple[bool, str]:
        """(whether the job ended, its state)."""
        raise NotImplementedError

    def live(self, jobs: dict[str, tuple[int, Path, str]]) -> dict[str, str]:
        """{run: RUNNING, PENDING, ... or ENDED} of jobs an earlier launcher submitted ({run: (tasks, folder, id)})."""
        raise NotImplementedError

    def cancel(self, jobs: dict[str, tuple[int, Path, str]]) -> None:
        raise NotImplementedError

    def nodes(self, job) -> list[str] | None:
        """The nodes a running job holds, when the scheduler says (None: it does not)."""
        return None

    def lost_nodes(self, nodes: list[str]) -> list[str]:
        """Which of `nodes` are now down or drained."""
        return []

    def quiet(self) -> None:
        """Silence what submitit would print on every poll."""

    def wait_for(self, job, tasks: int, poll_s: float, after_poll=lambda state: None) -> str:
        """Poll one job (the probe, a preparation) until it ends; `after_poll(state)` after every poll, the last one
        included, echoes its progress. Returns its final state."""
        while True:
            done, state = self.done(job, tasks, self.poll([str(job.job_id)]))
            after_poll(state)
            if done:
                return state
            time.sleep(self.poll_interval(poll_s))


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


class RanksExecutor(submitit.LocalExecutor):
    """A LocalExecutor whose job runs on `ranks` ranks forked by its one task."""

    def __init__(self, folder: Path, ranks: int):
        super().__init__(folder=folder)
        self.ranks = ranks

    def submit(self, job):
        federation = job.federation() if hasattr(job, "federation") else None  # fault-tolerant groups
        return super().submit(ForkedRanks(job, self.ranks, job.PRELOAD, federation))


class Local(Scheduler):
    """One submitit LocalExecutor job per run, on this machine: its one task imports the trainer and forks the
    run's ranks (train.job.forked_ranks)."""

    runs_here = True

    def poll_interval(self, poll_s: float) -> float:
        """At most LOCAL_POLL_S: a local job's state is its own process's, free to ask, and on a machine running
        one run at a time every second between a run's end and the next one's start is lost."""
        return min(poll_s, LOCAL_POLL_S)

    def topology(self) -> tuple[Topology, str, bool]:
        return topology.virtual(self.cluster)

    def resources(self, planned: PlannedRun) -> dict:
        return {"executor": "local", "tasks": planned.run.spec.world_size, "timeout_min": self.cluster.time_min}

    def executor(self, planned: PlannedRun, folder: Path):
        executor = RanksExecutor(folder=folder, ranks=planned.run.spec.world_size)
        executor.update_parameters(tasks_per_node=1, nodes=1, timeout_min=self.cluster.time_min)
        return executor

    def cpu_executor(self, folder: Path, name: str, cpus: int, time_min: int, partition: str | None):
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(tasks_per_node=1, nodes=1, timeout_min=time_min)
        return executor

    def submit_job(self, executor, job, name: str, folder: Path):
        """A local controller's stderr goes to its log, and SIGINT (the cancel) reaches it."""
        with _inherited_by_a_local_controller(folder / "controller.log"):
            return executor.submit(job)

    def reattach(self, tasks: int, folder: Path, job_id: str):
        return ReattachedLocalJob(folder=folder, job_id=job_id, tasks=list(range(tasks)))

    def done(self, job, tasks: int, polled: dict | None = None) -> tuple[bool, str]:
        return job.done(), job.state

    def live(self, jobs: dict[str, tuple[int, Path, str]]) -> dict[str, str]:
        return {run_id: "RUNNING" if self.reattach(*job).get_info()["jobState"] == "RUNNING" else "ENDED"
                for run_id, job in jobs.items()}

    def cancel(self, jobs: dict[str, tuple[int, Path, str]]) -> None:
        for job in jobs.values():
            self.reattach(*job).cancel()


class Slurm(Scheduler):
    """sbatch through submitit: nodes x (tasks per node = GPUs per node), the cluster's partition, account, qos,
    time, setup lines and extra sbatch parameters."""

    reads_topology = True

    def __init__(self, cluster: Cluster):
        if not cluster.partition:
            raise ConfigError(f"cluster {cluster.name!r} has no partition: set cluster.partition=NAME "
                              f"(see `sinfo -s` for the partitions you can use)")
        super().__init__(cluster)

    def check_environment(self) -> None:
        super().check_environment()
        for tool in ("sbatch", "srun"):
            if shutil.which(tool) is None:
                raise SubmitError(f"cluster {self.cluster.name!r} uses SLURM but `{tool}` is not on PATH "
                                  f"(run on a login node, or use cluster=local)")

    def topology(self) -> tuple[Topology, str, bool]:
        return topology.load(self.cluster)

    def job_environment(self, results_dir: Path) -> list[str]:
        return jobenv.lines(self.cluster, results_dir)

    @functools.cached_property
    def accounting(self) -> bool:
        """Whether job states can come from sacct, submitit's only source."""
        return scontrol.accounting_enabled()

    def resources(self, planned: PlannedRun) -> dict:
        return {"executor": "slurm", **slurm_parameters(self.cluster, planned)}

    def script(self, planned: PlannedRun, folder: Path) -> str:
        return sbatch_text(self.cluster, planned, folder)

    def executor(self, planned: PlannedRun, folder: Path):
        executor = submitit.SlurmExecutor(folder=folder, python=self.cluster.python)
        executor.update_parameters(**slurm_parameters(self.cluster, planned))
        return executor

    def cpu_executor(self, folder: Path, name: str, cpus: int, time_min: int, partition: str | None):
        cluster = self.cluster
        executor = submitit.SlurmExecutor(folder=folder)
        params = {"job_name": name, "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": cpus, "time": time_min,
                  "partition": partition or cluster.partition, "setup": list(cluster.setup)}
        params.update({k: getattr(cluster, k) for k in ("account", "qos") if getattr(cluster, k)})
        executor.update_parameters(**params)
        return executor

    def entrypoint(self, planned: PlannedRun, spec_path: Path, topology_path: Path) -> TrainJob:
        """Ranks reordered at job start when placed by topology on a known tree (in_job), else SLURM's rank (pinned:
        its hostfile orders them; slurm: SLURM's own order is the point)."""
        if self.cluster.placement == "in_job" and planned.leaves:
            return PlacedTrainJob(str(spec_path), str(topology_path), self.cluster.gpus_per_node)
        return super().entrypoint(planned, spec_path, topology_path)

    def submit(self, planned: PlannedRun, spec_path: Path, folder: Path, topology_path: Path,
               preflight: tuple[int, int, float] | None = None):
        """A pinned run's hostfile is written (atomically) before its job exists."""
        if self.cluster.placement == "pinned":
            write_atomic(hostfile_path(planned.run), planned.placement.hostfile())
        return super().submit(planned, spec_path, folder, topology_path, preflight)

    def submit_job(self, executor, job, name: str, folder: Path):
        """sbatch is tried again only when slurmctld was busy or away (SBATCH_TRANSIENT); any other refusal is one
        line naming `name`."""
        for attempt in range(1, SBATCH_TRIES + 1):
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr, then raises it
                    return executor.submit(job)
            except submitit.core.utils.FailedJobError as exc:
                message = next((line.strip() for line in str(exc).splitlines() if line.strip()), "no message")
                if attempt == SBATCH_TRIES or not any(t in message for t in SBATCH_TRANSIENT):
                    raise SubmitError(f"sbatch refused {name}: {message}") from None
                print(f"sbatch: {message}; trying again in {SBATCH_WAIT_S:g} s ({attempt}/{SBATCH_TRIES})",
                      flush=True)
                time.sleep(SBATCH_WAIT_S)

    def reattach(self, tasks: int, folder: Path, job_id: str):
        return submitit.SlurmJob(folder=folder, job_id=job_id, tasks=list(range(tasks)))

    def poll(self, job_ids: list[str]) -> dict[str, str | None]:
        return scontrol.job_states(job_ids)

    def done(self, job, tasks: int, polled: dict | None = None) -> tuple[bool, str]:
        """With accounting, sacct says a cancelled job ended while its tasks may still run for KillWait seconds
        (squeue: COMPLETING): it is done only once they are gone, so a retry never meets them in the run
        directory. Without accounting submitit (which asks only sacct) is bypassed: a job is done when every task
        left its result pickle, or when squeue/scontrol say it ended (or no longer know it). `polled`: this
        poll's job states (asked here when absent).

        PREEMPTED, as SLURM means it: submitit counts it unfinished, waiting for a requeue, which PreemptMode=CANCEL
        never makes; the job ended unless squeue shows it queued or running again (PreemptMode=REQUEUE: SLURM
        requeued it, the same job resumes). The launcher resubmits an ended one (launcher.actions.run)."""
        job_id = str(job.job_id)
        states = self.poll([job_id]) if polled is None else polled
        if self.accounting:
            if job.done():
                # squeue was asked at the start of this poll: unless it already saw the job end (or forgot it),
                # tasks may still run (COMPLETING after a cancel, or a cancel between the two queries).
                if states.get(job_id) not in (None, *FINAL_STATES):
                    return False, states[job_id]
                return True, job.state
            if job.state == "PREEMPTED":
                queued = states.get(job_id)
                return (True, "PREEMPTED") if queued in (None, *FINAL_STATES) else (False, queued)
            if job.state not in ("UNKNOWN", "NODE_FAIL"):
                return False, job.state
        elif all(submitit_compat.task_paths(job.paths.folder, job.job_id, task).result_pickle.exists()
                 for task in range(tasks)):
            return True, "COMPLETED"
        state = states.get(job_id)
        if state is None or state in FINAL_STATES:
            return True, state or "VANISHED"
        return False, state

    def live(self, jobs: dict[str, tuple[int, Path, str]]) -> dict[str, str]:
        """A fault-tolerant run's groups (job ids joined by commas, launcher.actions.groups) run while any does."""
        ids = {run_id: str(job_id).split(",") for run_id, (_, _, job_id) in jobs.items()}
        states = self.poll([i for group in ids.values() for i in group]) if ids else {}
        return {run_id: next((states[i] for i in group if states.get(i)), "ENDED") for run_id, group in ids.items()}

    def cancel(self, jobs: dict[str, tuple[int, Path, str]]) -> None:
        ids = [i for _, _, job_id in jobs.values() for i in str(job_id).split(",")]
        try:
            proc = subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SubmitError(f"scancel {' '.join(ids)} failed: {exc}") from None
        if proc.returncode:
            first = next(iter(proc.stderr.strip().splitlines()), f"exit code {proc.returncode}")
            raise SubmitError(f"scancel {' '.join(ids)} failed: {first}")

    def nodes(self, job) -> list[str] | None:
        return scontrol.job_nodes(str(job.job_id))

    def lost_nodes(self, nodes: list[str]) -> list[str]:
        return scontrol.lost_nodes(nodes)

    def quiet(self) -> None:
        logging.getLogger("submitit").setLevel(logging.ERROR)  # it warns whenever sacct has no data


SCHEDULERS = {"local": Local, "slurm": Slurm}


def of(cluster: Cluster) -> Scheduler:
    """The cluster's scheduler (cluster.executor, checked by launcher.settings)."""
    return SCHEDULERS[cluster.executor](cluster)


@contextlib.contextmanager
def _inherited_by_a_local_controller(log: Path):
    """While submitit starts a local controller, which inherits them: stderr (fd 2) goes to `log`, so its traceback
    when Ctrl-C or a cancel interrupts it lands there, not on the terminal; and SIGINT is not ignored. A launcher a
    shell started in the background (`nohup python -m launcher ... &`) ignores it, and the controller, its task and
    ranks would then not end on action=cancel; a handler of Python's, which exec resets, stands in meanwhile."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved, ignored = os.dup(2), signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, lambda *_: None)
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
