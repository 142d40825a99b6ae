"""`python -m train SPEC.json` under torchrun, srun, or plain python (one rank).

`train.job.TrainJob(spec_path)` is the same entrypoint as a picklable callable for submitit.
"""
from __future__ import annotations

import sys

from .errors import FedshardError
from .job import TrainJob


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
