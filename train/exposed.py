"""Exposed communication, measured in the training steps themselves: the time the training thread spends blocked
waiting for collectives, per step.

Every c10d collective's wait goes through `Work.wait` (FSDP2's all-gathers and reduce-scatters, HSDP's and
FedAvg's all-reduces, the pipeline's sends and receives; a blocking call waits on its Work too), so `Blocked`
wraps that one method while the run trains. On CPU (gloo) each collective runs on gloo's threads while the
training thread computes or waits: the time it waits is the communication compute did not hide. Nothing runs
after training for it, so no measurement raises a device's memory above training's own peak. Not measured:
- on GPU, where a wait makes the stream wait, not the host (a profiler trace of the steps measures it there);
- with tensor parallelism, whose DTensor collectives wait in functional `wait_tensor` calls, not in Work.wait.
"""
from __future__ import annotations

import time

import torch.distributed as dist

NOT_MEASURED = "not measured: {}"
METHOD = ("time the training thread spent blocked in collectives' waits during each training step (max over "
          "ranks per step, mean over the steps after the first)")


def why_not(device: str, tp: int) -> str | None:
    """Why this run's exposed communication cannot be measured, or None when it can."""
    if device == "cuda":
        return NOT_MEASURED.format("on GPU a collective's wait holds the stream, not the host; take a profiler "
                                   "trace of the steps")
    if tp > 1:
        return NOT_MEASURED.format(f"tp={tp}: tensor-parallel collectives wait inside DTensor, not in Work.wait")
    return None


class Blocked:
    """While entered, the seconds spent in `Work.wait`, collected by `take` (a streamed exchange waits on the
    training thread too, where its result is used: what the steps did not hide of it counts)."""

    def __init__(self):
        self.seconds = 0.0
        self._wait = None

    def __enter__(self) -> "Blocked":
        wait = self._wait = dist.Work.wait

        def timed(work, *args, **kwargs):
            started = time.perf_counter()
            try:
                return wait(work, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        dist.Work.wait = timed
        return self

    def __exit__(self, *exc) -> None:
        dist.Work.wait = self._wait

    def take(self) -> float:
        """Seconds blocked since the last take."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds
