"""Exposed communication, measured in the training steps themselves: how long each step waits for collectives.

Every c10d collective's wait goes through `Work.wait` (FSDP2's all-gathers and reduce-scatters, HSDP's and
FedAvg's all-reduces, the pipeline's sends and receives; a blocking call waits on its Work too), and on GPU every
wait of one stream on another through `torch.cuda.Stream.wait_event` (FSDP2 makes the compute stream wait for its
all-gather and reduce-scatter streams there, and a streamed exchange lands there: train.federation.inflight). `Blocked`
wraps both while the run trains:
- on CPU (gloo) each collective runs on gloo's threads while the training thread computes or waits: the host time
  spent in `Work.wait` is the communication compute did not hide;
- on GPU a wait holds the stream, not the host: an event recorded on the current stream just before the wait and
  one just after bound the stream's stall (the first completes when the work queued before the wait is done, the
  second when what it waited for is also done), read when the step logs, with the phases (metrics.StepLog).
Nothing runs after training for it, so no measurement raises a device's memory above training's own peak. Not
measured with tensor parallelism, whose DTensor collectives wait in functional `wait_tensor` calls, in C++.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

NOT_MEASURED = "not measured: {}"
METHOD = {"cpu": "time the training thread spent blocked in collectives' waits during each training step (max over "
                 "ranks per step, mean over the steps after the first)",
          "cuda": "time the compute stream stalled at waits on collectives and communication streams during each "
                  "training step, between events recorded around each wait (max over ranks per step, mean over the "
                  "steps after the first)"}


def why_not(device: str, tp: int) -> str | None:
    """Why this run's exposed communication cannot be measured, or None when it can."""
    if tp > 1:
        return NOT_MEASURED.format(f"tp={tp}: tensor-parallel collectives wait inside DTensor, not in Work.wait")
    return None


def seconds(blocked) -> float:
    """A step's `take` in seconds: as is on CPU; on GPU its (before, after) event pairs, complete by now."""
    if isinstance(blocked, float):
        return blocked
    return sum(before.elapsed_time(after) for before, after in blocked) / 1e3


class Blocked:
    """While entered, the waits on communication, collected per step by `take` (module docstring)."""

    def __init__(self, device: str = "cpu"):
        self.cuda = device == "cuda"
        self.seconds = 0.0
        self.pairs: list = []  # GPU: (before, after) events around each of the training stream's waits
        self._saved: list = []
        self._stream = None  # GPU: the training stream, current when entered

    def __enter__(self) -> "Blocked":
        self._stream = torch.cuda.current_stream().cuda_stream if self.cuda else None
        work_wait = dist.Work.wait
        self._saved = [(dist.Work, "wait", work_wait)]
        dist.Work.wait = self._timed_on_host(work_wait) if not self.cuda else self._timed_on_stream(work_wait)
        if self.cuda:
            stream_wait = torch.cuda.Stream.wait_event
            self._saved.append((torch.cuda.Stream, "wait_event", stream_wait))
            torch.cuda.Stream.wait_event = self._timed_on_stream(stream_wait, stream_method=True)
        return self

    def _timed_on_host(self, wait):
        def timed(work, *args, **kwargs):
            started = time.perf_counter()
            try:
                return wait(work, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return timed

    def _timed_on_stream(self, wait, stream_method: bool = False):
        """`wait` bracketed by events on the training stream, when that is the stream that waits: a Work's wait
        holds the current stream, a Stream method its own (FSDP2's copy and communication streams, and a streamed
        exchange's, wait on others too: hidden from training, so not exposed)."""
        def timed(waiter, *args, **kwargs):
            current = torch.cuda.current_stream()
            waits = waiter.cuda_stream if stream_method else current.cuda_stream
            if waits != self._stream or current.cuda_stream != self._stream:
                return wait(waiter, *args, **kwargs)
            before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            current.record_event(before)
            try:
                return wait(waiter, *args, **kwargs)
            finally:
                current.record_event(after)
                self.pairs.append((before, after))
        return timed

    def __exit__(self, *exc) -> None:
        for owner, name, original in self._saved:
            setattr(owner, name, original)

    def take(self):
        """The waits since the last take: seconds on CPU, event pairs on GPU (`seconds` reads them)."""
        if self.cuda:
            pairs, self.pairs = self.pairs, []
            return pairs
        seconds, self.seconds = self.seconds, 0.0
        return seconds
