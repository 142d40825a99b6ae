"""`python -m tests.crash_in_checkpoint STEP RANK SPEC.json`: the training entrypoint, except that rank RANK
SIGKILLs itself in the middle of writing the checkpoint of step STEP, after its model shards are on disk
and before the checkpoint is published. Used by torchrun in tests/test_checkpoint.py."""
import os
import signal
import sys

import train.runtime.checkpoint as checkpoint
from train.__main__ import main


def _crash_after(save, step: str, rank: str):
    def dcp_save(state, checkpoint_id):
        result = save(state, checkpoint_id=checkpoint_id)
        if checkpoint_id.endswith(f".step-{int(step):06d}.tmp") and os.environ["RANK"] == rank:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return dcp_save


if __name__ == "__main__":
    step, rank, spec = sys.argv[1:]
    checkpoint.dcp.save = _crash_after(checkpoint.dcp.save, step, rank)
    sys.exit(main([spec]))
