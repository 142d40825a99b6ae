"""`python -m tests.stop_at_step STEP SPEC.json`: the training entrypoint, except that every rank receives the
scheduler's stop signal (USR2) right after step STEP, as `scancel --signal=USR2` delivers it. Used by
tests/test_diloco.py to stop a streamed run while an exchange is in flight."""
import os
import sys

import train.loop as loop
from train.__main__ import main
from train.runtime.preemption import stop_signal


def _signalled_after(step_fn, step: int):
    def step_then_signal(self, i):
        out = step_fn(self, i)
        if i + 1 == step:
            os.kill(os.getpid(), stop_signal())
        return out
    return step_then_signal


if __name__ == "__main__":
    step, spec = sys.argv[1:]
    loop.Trainer.step = _signalled_after(loop.Trainer.step, int(step))
    sys.exit(main([spec]))
