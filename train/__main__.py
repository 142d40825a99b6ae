"""`python -m train SPEC.json` under torchrun, srun, or plain python (one rank).

`train.job.TrainJob(spec_path)` is the same entrypoint as a picklable callable for submitit.
"""
from __future__ import annotations

import sys

from train.contract.common import FedshardError
from train.job import TrainJob
from train.runtime.ending import leave_without_finalization

USAGE = """usage: python -m train SPEC.json

Train one run spec (JSON, written by the launcher as <run dir>/spec.json; keys: train/contract/spec.py).
Rank and world size come from torchrun, srun or submitit; with none of them, one rank.
A rerun resumes from the newest checkpoint in the spec's out_dir (a spec that differs from the
checkpoint's in any key the result depends on is refused). Writes <out_dir>/result.json
(docs/result-schema.md) and metrics.jsonl."""


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 1:
        print(USAGE.split("\n", 1)[0], file=sys.stderr)
        return 2
    try:
        TrainJob(argv[0])()
    except FedshardError as exc:
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    leave_without_finalization(main(sys.argv[1:]))  # everything is written (seen to abort under torchrun otherwise)
