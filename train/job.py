"""`TrainJob(spec_path)`: the training entrypoint as a picklable callable, for submitit (the launcher submits
it; `python -m train SPEC.json` calls it too)."""
from __future__ import annotations

from .result import RunResult
from .spec import RunSpec


class TrainJob:
    """Picklable for submitit: each task of the job runs one rank."""

    def __init__(self, spec_path: str):
        self.spec_path = str(spec_path)

    def __call__(self) -> RunResult | None:
        spec = RunSpec.load(self.spec_path)  # a bad spec fails before torch is even imported
        from .loop import run

        return run(spec)

    def checkpoint(self, *args, **kwargs):
        """submitit calls this when the job is preempted or reaches its time limit: requeue the same job,
        which resumes from the latest checkpoint in the run directory (train.checkpoint_every)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)
