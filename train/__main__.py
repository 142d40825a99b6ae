"""`python -m train SPEC.json` under torchrun, srun, or plain python (one rank).

`TrainJob(spec_path)` is the same entrypoint as a picklable callable for submitit.
"""
from __future__ import annotations

import sys

from .errors import FedshardError
from .spec import RunSpec


class TrainJob:
    """Picklable for submitit: each task of the job runs one rank."""

    def __init__(self, spec_path: str):
        self.spec_path = str(spec_path)

    def __call__(self) -> dict | None:
        spec = RunSpec.load(self.spec_path)  # a bad spec fails before torch is even imported
        from .loop import run

        return run(spec)

    def checkpoint(self, *args, **kwargs):
        """submitit calls this when the job is preempted or reaches its time limit: requeue the same job,
        which resumes from the latest checkpoint in the run directory (train.checkpoint_every)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m train SPEC.json   (rank/world from torchrun, srun or submitit)", file=sys.stderr)
        return 2
    try:
        TrainJob(argv[0])()
    except FedshardError as exc:
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
