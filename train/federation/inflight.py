"""The federation's exchanges in flight, without threads: collectives launched with async_op=True and waited where
their result is used, and the exchange timed where it runs.

An exchange is written as a generator that launches its next collectives, yields when they were launched and
their Works, and waits on them when resumed (`launched`); `together` runs several side by side, one stage at a
time. `InFlight` drives one:
- on GPU it is enqueued whole at launch on the clock's own stream, after that stream waits for the values the
  current stream computed; a Work's wait there holds that stream, not the host or the training stream, and
  `result` makes the current stream wait for it where the value is used;
- on CPU gloo runs each collective on its own threads: the first stage is launched at once, and `result` runs the
  rest where the value is used (a compressed exchange's all_gather, which needs the host to sum what the
  all_to_all brought, is then exposed on CPU). Nothing is launched or waited on the steps in between, which
  neither aggregate nor log: no collective spans the groups there.

`ExchangeClock` measures the seconds exchanges took where they ran: on GPU between events recorded on the stream
that ran them (the exchange's own, or the current one for a blocking average); on CPU from each stage's launch to
the first moment the training thread sees its collectives completed: it asks gloo (`Work.is_completed`, no wait)
after every step while a stage is in flight, and waits for it where its value is used. An exchange that completes
in the middle of a step is thus counted to that step's end. No Python runs on gloo's threads (a Future callback
would take the GIL and release tensors there). It is read once, after training.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch
import torch.distributed as dist

Stage = tuple[float, list[dist.Work]]  # when a stage's collectives were launched (host clock), their Works
Exchange = Generator[Stage, None, object]  # yields each stage, returns the exchange's value


def launched(launch: Callable[[], list[dist.Work]]) -> Generator[Stage, None, None]:
    """Launch a stage's collectives (async_op=True) and hand them to the driver; wait on them when resumed
    (`yield from launched(...)`)."""
    start = time.perf_counter()
    works = launch()
    yield start, works
    for work in works:
        work.wait()


def together(exchanges: list[Exchange]) -> Exchange:
    """Several exchanges side by side: each stage launches every one's next collectives; returns their values."""
    values: list = [None] * len(exchanges)
    live = list(enumerate(exchanges))
    while live:
        starts, works, still = [], [], []
        for i, exchange in live:
            try:
                start, launched_works = next(exchange)
            except StopIteration as done:
                values[i] = done.value
                continue
            starts.append(start)
            works += launched_works
            still.append((i, exchange))
        live = still
        if still:
            yield min(starts), works
    return values


def run(exchange: Exchange) -> object:
    """An exchange waited stage by stage, at once (a blocking exchange)."""
    try:
        while True:
            next(exchange)
    except StopIteration as done:
        return done.value


class ExchangeClock:
    """Seconds spent exchanging across groups, hidden behind training or not, timed where the exchange ran."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.stream = torch.cuda.Stream() if self.cuda else None
        self.spans: list = []  # GPU: (start, end) events; CPU: [start, end or None, works still in flight]
        self.open: list = []  # CPU: the stages in flight

    def mark(self, stream=None):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def span(self, start, end) -> None:
        """A span between two marks of the same stream (on CPU: the host's clock around a blocking exchange)."""
        self.spans.append([start, end, []] if not self.cuda else (start, end))

    def stage(self, start: float, works: list[dist.Work]) -> list:
        """CPU: a stage launched at `start`, open until its collectives are seen completed (`poll`, `landed`)."""
        span = [start, None, list(works)]
        self.spans.append(span)
        self.open.append(span)
        return span

    def poll(self) -> None:
        """CPU: close every open stage whose collectives gloo has completed (asked without waiting)."""
        for span in [s for s in self.open if all(work.is_completed() for work in s[2])]:
            self._close(span)

    def _close(self, span: list, end: float | None = None) -> None:
        span[1], span[2] = time.perf_counter() if end is None else end, []
        self.open.remove(span)

    def landed(self, span: list, end: float | None = None) -> None:
        """CPU: a stage whose collectives the exchange has just waited for (at `end`: when the next stage began, or
        now), unless a poll saw them completed earlier."""
        if span[1] is None:
            self._close(span, end)

    def seconds(self) -> float:
        """The total, read after training (on GPU it waits for the last exchange's events)."""
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) / 1e3 for a, b in self.spans)
        return sum(end - start for start, end, _ in self.spans if end is not None)


class InFlight:
    """One exchange launched now and landed by `result` (module docstring)."""

    def __init__(self, exchange: Exchange, clock: ExchangeClock):
        self.exchange, self.clock = exchange, clock
        self.done, self.value, self.in_flight = False, None, None
        if clock.cuda:
            stream = clock.stream
            stream.wait_stream(torch.cuda.current_stream())  # the values to send were computed there
            with torch.cuda.stream(stream):
                start = clock.mark(stream)
                self.value, self.done = run(exchange), True
                clock.span(start, clock.mark(stream))
        else:
            self._next()

    def _next(self) -> None:
        """CPU: wait for the stage in flight (if any) and launch the next."""
        try:
            start, works = next(self.exchange)  # waits for the stage in flight, then launches the next
        except StopIteration as done:
            if self.in_flight is not None:
                self.clock.landed(self.in_flight)
            self.value, self.done, self.in_flight = done.value, True, None
            return
        if self.in_flight is not None:
            self.clock.landed(self.in_flight, start)
        self.in_flight = self.clock.stage(start, works)

    def result(self):
        """The exchange's value, usable on the current stream from here on."""
        while not self.done:
            self._next()
        if self.clock.cuda:
            current = torch.cuda.current_stream()
            current.wait_stream(self.clock.stream)
            for t in self.value:
                t.record_stream(current)  # allocated on the exchange's stream, freed after use on this one
        return self.value
