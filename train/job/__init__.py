"""Every job the launcher starts, as the one entry point it imports from train/ besides the contract: training
(`TrainJob(spec_path)`, a picklable callable for submitit; `python -m train SPEC.json` calls it too), a local
job's forked ranks, the fake-tensor dry-run, the probe and data preparation."""
from __future__ import annotations

from train.contract.result import RunResult
from train.contract.spec import RunSpec
from train.runtime.ending import leave_when_the_task_ends


class TrainJob:
    """Picklable for submitit: each task of the job runs one rank."""

    PRELOAD = ("train.loop",)  # what its ranks import (train.job.forked_ranks imports it once, before forking them)

    def __init__(self, spec_path: str):
        self.spec_path = str(spec_path)

    def __call__(self) -> RunResult | None:
        spec = RunSpec.load(self.spec_path)  # a bad spec fails before torch is even imported
        from train.loop import run

        result = run(spec)
        leave_when_the_task_ends()
        return result

    def federation(self):
        """train.fault_tolerance=groups: what the local job's supervisor starts each group with; else None."""
        from train.federation.lighthouse import Federation

        return Federation.of(RunSpec.load(self.spec_path))

    def lighthouse(self, host: str, log):
        """train.fault_tolerance=groups on SLURM: the run's Lighthouse, started on this (the submitting) host,
        advertised to the groups' jobs as `host`, writing to `log` (train.federation.lighthouse); `.address`,
        `.stop()`."""
        from train.federation.lighthouse import Lighthouse

        return Lighthouse(self.federation(), host, log)

    def clear_groups(self) -> None:
        """Before a fault-tolerant run's groups start: no group is ready yet (train.federation.lighthouse)."""
        from train.federation.lighthouse import clear_ready

        clear_ready(RunSpec.load(self.spec_path))

    def merge_groups(self, restarts: list[dict], left_out: list[int] = ()) -> RunResult:
        """A fault-tolerant run's result from its groups' (train.federation.accounting), less the `left_out` ones."""
        from train.federation.accounting import merge

        return merge(RunSpec.load(self.spec_path), restarts, left_out)

    def checkpoint(self, *args, **kwargs):
        """submitit calls this when the job is preempted or reaches its time limit: requeue the same job,
        which resumes from the latest checkpoint in the run directory (train.checkpoint_every)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)
