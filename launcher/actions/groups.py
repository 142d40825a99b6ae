"""A fault-tolerant run on SLURM (train.fault_tolerance=groups): each federation group is a SLURM job of its own, so
a lost node ends only its group's job, and the other groups train on (train.federation.groups).

The launcher starts the run's torchft Lighthouse on the submitting host, where it already waits for the run
(train.federation.lighthouse says why there), then submits one job per group. A group's job that ends without its
result (a lost node: NODE_FAIL; a failed rank) is submitted again, at most GROUP_RESTARTS times, while another group
still trains; the new job heals from a live peer at the next average. The jobs ask not to be requeued: the launcher
resubmits a lost group at once, where SLURM's requeue would first wait cred_expire, and counts every restart itself.
Once every group has ended well the run's result is merged from theirs (train.federation.accounting); a lost group
whose new job had not come back when the others ended (its node stays down, no other is free) is cancelled and left
out of it."""
from __future__ import annotations

import socket
import time
from pathlib import Path

from launcher.actions.outcome import failure_reason
from launcher.scheduler import FINAL_STATES
from launcher.submit import group_parameters
from launcher.sweep import PlannedRun
from train.contract import submitit_compat
from train.contract.config import GROUP_RESTARTS, not_restarted
from train.contract.result import RunResult
from train.job import TrainJob

RUNNING = ("RUNNING", "COMPLETING")


class GroupJobs:
    """What the launcher watches for a fault-tolerant run on SLURM, in place of one job: one job per federation
    group, and the Lighthouse they meet at. `job_id` lists the groups' current jobs (comma-separated)."""

    def __init__(self, scheduler, planned: PlannedRun, spec_path: Path, folder: Path):
        self.scheduler, self.planned, self.folder = scheduler, planned, folder
        self.entry = TrainJob(str(spec_path))
        L = planned.run.spec.layout
        self.F, self.size = L.F, L.group_world
        self.starts = [0] * self.F
        self.restarts: list[dict] = []  # {group, start, at, why}, as train.federation.accounting reads them
        self.ended: set[int] = set()  # groups whose job ended with their result
        self.failure: str | None = None
        self.entry.clear_groups()  # a failed attempt's ready marks must not let this one's first quorum start early
        cluster = scheduler.cluster
        self.lighthouse = self.entry.lighthouse(cluster.lighthouse_host or socket.getfqdn(), folder / "lighthouse.log")
        self.jobs: list = []
        try:
            for group in range(self.F):
                self.jobs.append(self._submit(group))
        except BaseException:  # the groups submitted before the refusal do not train on without the others
            self.cancel()
            raise

    @property
    def job_id(self) -> str:
        return ",".join(str(job.job_id) for job in self.jobs)

    def _submit(self, group: int):
        import submitit

        params = group_parameters(self.scheduler.cluster, self.planned, group, self.starts[group],
                                  self.lighthouse.address)
        executor = submitit.SlurmExecutor(folder=self.folder / f"group{group}", python=self.scheduler.cluster.python)
        executor.update_parameters(**params)
        return self.scheduler.submit_job(executor, self.entry, params["job_name"], self.folder)

    def state(self, polled: dict) -> tuple[bool, str]:
        """(whether the run ended, its state): a lost group's job is submitted again here while another trains."""
        states = []
        for group, job in enumerate(self.jobs):
            if group in self.ended or self.failure is not None:
                continue
            # squeue's word first: sacct, which submitit reads, learns of a lost node seconds later; a job squeue and
            # scontrol no longer know ended if the scheduler's own check agrees (a timed-out query is no loss)
            state = polled.get(str(job.job_id))
            done = state in FINAL_STATES or (state is None and self.scheduler.done(job, self.size, polled)[0])
            if not done:
                states.append(state)
                continue
            if self._ended_well(job):
                self.ended.add(group)
                continue
            self._lost(group, job, state, polled)
        if self.failure is not None:
            return True, "FAILED"
        left_out = self._left_out()
        if len(self.ended) + len(left_out) == self.F:
            for group in left_out:
                self.jobs[group].cancel(check=False)
                print(f"{self.planned.run.run_id}: federation group {group} had not come back when the others ended "
                      f"(train.timeout_s after their last step); cancelled its job {self.jobs[group].job_id} and left "
                      f"it out", flush=True)
            self.lighthouse.stop()
            self.entry.merge_groups(self.restarts, left_out)
            return True, "COMPLETED"
        return False, next((s for s in states if s in RUNNING), states[0] if states else "RUNNING")

    def _left_out(self) -> list[int]:
        """The lost groups the others stopped waiting for (train.federation.groups' closing rounds): once every group
        but lost ones ended well, each having left a round that missed some, no peer is left for them to heal from."""
        missing = [g for g in range(self.F) if g not in self.ended]
        if not missing or not self.ended or any(self.starts[g] == 0 for g in missing):
            return []
        run_dir = Path(self.planned.run.spec.out_dir)
        lives = [RunResult.load(run_dir / f"group{g}" / "result.json").groups[0] for g in self.ended]
        return missing if all(life.get("left_out") for life in lives) else []

    def _ended_well(self, job) -> bool:
        """Every task of the group's job returned (submitit's result pickles): sacct's state may still say RUNNING."""
        return all((submitit_compat.task_outcome(job.paths.folder, job.job_id, task) or ("",))[0] == "success"
                   for task in range(self.size))

    def _lost(self, group: int, job, state: str, polled: dict) -> None:
        why = f"federation group {group}'s job {job.job_id} ended {state or 'VANISHED'}: " \
              f"{failure_reason(job, self.size)}"
        reason = not_restarted(self.starts[group], self._others_train(group, polled))
        if reason:
            self.failure = f"{why} ({reason})"
            self.cancel()
            return
        self.starts[group] += 1
        self.restarts.append({"group": group, "start": self.starts[group], "at": time.time(), "why": why})
        self.jobs[group] = self._submit(group)
        print(f"{self.planned.run.run_id}: {why}; submitted it again as job {self.jobs[group].job_id} "
              f"({self.starts[group]} of {GROUP_RESTARTS}): it heals from a group still training", flush=True)

    def _others_train(self, group: int, polled: dict) -> bool:
        """Whether a group other than `group` may hold the run's state to heal from: one whose job has not ended and
        runs, or whose state the scheduler did not say. A lost group's new job (waiting in the queue, or submitted
        in this poll) holds nothing: were every other group such, a restart would only meet restarted groups, which
        train.federation.groups fails, so the run goes at once to its retry, from the groups' common checkpoint."""
        def may_hold(g: int) -> bool:
            job_id = str(self.jobs[g].job_id)
            return job_id in polled and polled[job_id] in (None, *RUNNING)

        return any(may_hold(g) for g in range(self.F) if g != group and g not in self.ended)

    def nodes(self) -> list[str]:
        return sorted({n for job in self.jobs for n in self.scheduler.nodes(job) or []})

    def cancel(self, check: bool = False) -> None:
        for group, job in enumerate(self.jobs):
            if group not in self.ended:
                job.cancel(check=False)
        self.lighthouse.stop()
