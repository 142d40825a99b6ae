"""PREEMPTED and NODE_FAIL as SLURM means them (issue 57; submitit #1770 treats PREEMPTED as unfinished, forever
under PreemptMode=CANCEL): a preempted job that SLURM did not requeue ends, and its run goes again at once from its
checkpoint without spending a retry; a job SLURM requeued is waited on; a node failure is named and retried. The
states are the squeue and sacct lines of tests/fixtures/job_states/, read through the real parsers (fake squeue,
sacct and scontrol on PATH); the Sweeper is driven by a scheduler whose jobs end in those states. The same on real
SLURM: tests/test_testbed.py."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit

from launcher import scheduler as schedulers
from launcher.actions.outcome import NODE_FAILURE, retryable
from launcher.actions.plan import plan
from launcher.actions.run import Sweeper
from launcher.settings import compose
from launcher.sweep import expand
from tests.support import ROOT, make_result
from train.contract import submitit_compat

STATES = ROOT / "tests" / "fixtures" / "job_states"
ACCOUNTING = "AccountingStorageType = accounting_storage/slurmdbd"


def _slurm(tmp_path, monkeypatch, squeue: str, sacct: str | None) -> schedulers.Slurm:
    """A Slurm scheduler whose squeue and sacct print these fixtures (sacct None: no accounting)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"squeue": f"cat {STATES / squeue}\n",
             "sacct": f"cat {STATES / sacct}\n" if sacct else "echo 'accounting storage is disabled' >&2\nexit 1\n",
             "scontrol": ('case "$*" in "show config") echo "'
                          + (ACCOUNTING if sacct else "AccountingStorageType = accounting_storage/none")
                          + '";; *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1;; esac\n')}
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    cluster = compose(["cluster=leonardo", f"results_dir={tmp_path}"]).cluster
    return schedulers.Slurm(cluster)


def _job(tmp_path, job_id: str) -> submitit.SlurmJob:
    job = submitit.SlurmJob(folder=tmp_path / "submitit", job_id=job_id, tasks=[0])
    job.watcher.clear()  # submitit's watcher is shared by every SlurmJob of the process: no state from another test
    return job


def test_a_job_preempted_and_not_requeued_has_ended(tmp_path, monkeypatch):
    """sacct says PREEMPTED, which submitit counts unfinished; squeue says PREEMPTED too (PreemptMode=CANCEL):
    the job ended, where the launcher used to wait for it forever."""
    slurm = _slurm(tmp_path, monkeypatch, "squeue_preempted.txt", "sacct_preempted.txt")
    job = _job(tmp_path, "4242")
    assert not job.done() and job.state == "PREEMPTED"  # submitit alone would wait
    assert slurm.done(job, 1) == (True, "PREEMPTED")


def test_a_job_slurm_requeued_after_preemption_is_waited_on(tmp_path, monkeypatch):
    """PreemptMode=REQUEUE: the same job id is queued again and resumes from its checkpoint; not ended."""
    slurm = _slurm(tmp_path, monkeypatch, "squeue_requeued.txt", "sacct_preempted.txt")
    assert slurm.done(_job(tmp_path, "4242"), 1) == (False, "PENDING")


def test_preempted_and_node_fail_end_a_job_without_accounting_too(tmp_path, monkeypatch):
    slurm = _slurm(tmp_path, monkeypatch, "squeue_preempted.txt", None)
    assert slurm.done(_job(tmp_path, "4242"), 1) == (True, "PREEMPTED")


def test_a_node_failure_ends_the_job_as_node_fail(tmp_path, monkeypatch):
    slurm = _slurm(tmp_path, monkeypatch, "squeue_node_fail.txt", "sacct_node_fail.txt")
    assert slurm.done(_job(tmp_path, "4243"), 1) == (True, "NODE_FAIL")


def _state(name: str) -> str:
    """The state a captured squeue line gives its job."""
    return (STATES / name).read_text().split()[1]


class Scripted(schedulers.Local):
    """Jobs that end as told, one outcome per submission: (SLURM state, whether the run leaves its result.json,
    what its task 0 wrote to stderr); placed as cluster=local places them."""

    def __init__(self, cluster, outcomes: list[tuple[str, bool, str]]):
        super().__init__(cluster)
        self.outcomes, self.submitted, self.cancelled = list(outcomes), [], []

    def submit(self, planned, spec_path: Path, folder: Path, topology_path: Path, preflight=None):
        state, result, stderr = self.outcomes.pop(0)
        job_id = str(4242 + len(self.submitted))
        job = SimpleNamespace(job_id=job_id, paths=SimpleNamespace(folder=folder), run_dir=spec_path.parent,
                              outcome=(state, result), cancel=lambda check=True: self.cancelled.append(job_id))
        log = submitit_compat.task_paths(folder, job_id, 0).stderr
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(stderr)
        self.submitted.append(job_id)
        return job

    def poll_interval(self, poll_s: float) -> float:
        return 0.0

    def done(self, job, tasks: int, polled: dict | None = None) -> tuple[bool, str]:
        state, result = job.outcome
        if result:
            make_result(run_id=job.run_dir.name).save(job.run_dir / "result.json")
        return True, state


def _sweeper(tmp_path, outcomes, *overrides) -> tuple[Sweeper, Scripted, list]:
    settings = compose(["sweep.strategies=[fsdp]", f"results_dir={tmp_path}", *overrides])
    runs = expand(settings)
    sweeper = Sweeper(settings)
    sweeper.scheduler = Scripted(settings.cluster, outcomes)
    return sweeper, sweeper.scheduler, plan(settings, runs, echo=False)[0]


def test_a_preempted_run_goes_again_from_its_checkpoint_without_spending_a_retry(tmp_path, capsys):
    """retries=0: a preemption that counted as a failure would end the run FAILED."""
    sweeper, scheduler, planned = _sweeper(tmp_path, [(_state("squeue_preempted.txt"), False, "slurmstepd: error: "
                                                       "*** JOB 4242 CANCELLED DUE TO PREEMPTION ***\n"),
                                                      ("COMPLETED", True, "")], "retries=0")
    sweeper.run(planned)
    [run_id] = [p.run.run_id for p in planned]
    entry = sweeper.store.entries[run_id]
    assert (entry["state"], entry["attempts"], entry["preemptions"]) == ("COMPLETED", 2, 1)
    assert not sweeper.failed and scheduler.submitted == ["4242", "4243"]
    assert scheduler.cancelled == ["4242"]  # had SLURM meant to requeue it after all, only the resubmission runs
    out = capsys.readouterr().out
    assert "was preempted (SLURM: PREEMPTED); resubmitting it to resume from its last checkpoint" in out
    assert "retrying" not in out and "FAILED" not in out


def test_a_node_failure_is_named_and_retried_whatever_its_tasks_wrote(tmp_path, capsys):
    """The surviving task's last error line may look deterministic (here a DataError from a half-read shard when
    its node went away); NODE_FAIL says the node failed, and another attempt may pass."""
    stderr = "train.contract.common.DataError: shard 3 ended early\nsrun: error: tb2: task 1: Killed\n"
    sweeper, scheduler, planned = _sweeper(tmp_path, [(_state("squeue_node_fail.txt"), False, stderr),
                                                      ("COMPLETED", True, "")], "retries=1")
    sweeper.run(planned)
    [run_id] = [p.run.run_id for p in planned]
    out = capsys.readouterr().out
    assert f"{run_id}: FAILED ({NODE_FAILURE}: train.contract.common.DataError: shard 3 ended early)" in out
    assert "retrying 1 failed run(s)" in out and "not retrying" not in out
    assert sweeper.store.entries[run_id]["state"] == "COMPLETED" and scheduler.submitted == ["4242", "4243"]


@pytest.mark.parametrize("reason, again", [(f"{NODE_FAILURE}: train.contract.common.DataError: x", True),
                                           ("train.contract.common.DataError: x", False),
                                           ("srun: error: tb1: task 0: Killed", True)])
def test_what_is_retried(reason, again):
    assert retryable(reason) is again
