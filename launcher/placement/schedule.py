"""One optimizer step of one rank as a small discrete-event schedule, not a sum: sum and max are only its limits.

Resources: the compute stream, FSDP2's communication streams (all-gathers on one, reduce-scatters on another, HSDP's
replicate all-reduce on a third, each after its reduce-scatter) and each link level the rank's groups cross. Every op
starts at the earliest time its inputs are ready and its resources are free, in the order the rank issues it: a
resource serves its ops first come, first served, as one NCCL communicator runs its collectives in issue order, so
a backward all-gather queues behind the reduce-scatter issued before it on the same links.
- forward: each FSDP unit's all-gather, then its compute; with FSDP2's implicit prefetch a unit's all-gather may start
  once the previous unit's compute has started (one unit ahead), without it (train.prefetch=false, the authors'
  FSDP1: forward_prefetch=False, backward_prefetch=None) only once that compute has ended, so it is all exposed;
- backward, units in reverse: the all-gather again where the unit was resharded after forward (prefetched one unit
  ahead, or not), its compute, its reduce-scatter after it, and HSDP's all-reduce after that;
- the optimizer once every reduction has landed (FSDP2 waits for them at the end of backward);
- pipeline stages: m + P - 1 slots each way, the first microbatch's forward and the last's backward unit by unit (the
  stage is gathered once, in the first, and reduced in the last), the other slots and their sends whole;
- tensor-parallel collectives and pipeline sends on the compute stream's path (nothing overlaps them), the FedAvg or
  DiLoCo exchange every A steps after the optimizer, amortised per step, never overlapped.
On CPU (gloo) every collective blocks its rank, so the schedule is a sum, but the node's ranks share its cores:
compute is processor-shared with the ranks then on a core (Cores.stretch), not assumed alone nor all at once.
What comes back, each part to check on its own against a run's result.json: the step, its compute, and what the compute
stream waited for, by group kind and by link level (exposed traffic: result.json's exposed_comm_s measures it).
Pure Python, linear in the units: action=plan ranks hundreds of layouts with it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.placement.levels import level_name

NO_WIRE = 1 << 30  # Cores.wire_level where no level is a wire: every byte moves through the cores (virtual nodes)


@dataclass(frozen=True)
class Comm:
    """A collective's seconds, the group kind it serves (shard, replicate, federation, tensor, pipeline) and the link
    levels it holds (levels.traffic's keys; -1 inside a node)."""

    seconds: float
    kind: str
    levels: tuple[int, ...] = ()

    @property
    def level(self) -> str:
        """The highest level it crosses, by the probe's name: where its exposed time is booked."""
        return level_name(max(self.levels)) if self.levels else "none"


@dataclass(frozen=True)
class Unit:
    """An FSDP unit of the rank's stage, in forward order: its compute over the step's microbatches (no bubble) and
    its collectives; `regather`: resharded after forward, so gathered again in backward."""

    forward_s: float
    backward_s: float
    gather: Comm | None = None
    reduce: Comm | None = None
    replicate: Comm | None = None
    regather: bool = False


@dataclass(frozen=True)
class Pipeline:
    """A pipeline stage's schedule: m microbatches over P stages, m + P - 1 slots each way, each slot ending in one
    `send` (activations forward, their gradient back)."""

    microbatches: int = 1
    stages: int = 1
    send: Comm | None = None

    @property
    def slots(self) -> int:
        return self.microbatches + self.stages - 1


@dataclass(frozen=True)
class Cores:
    """CPU ranks (gloo) sharing one machine's cores: in the run, and when the compute was measured (the probe times
    every rank at once, so its seconds carry that sharing; estimated compute is one rank alone)."""

    ranks: int                 # the run's ranks on one machine: a node's, or the job's where nodes are virtual
    cores: float               # that machine's cores
    measured_ranks: int = 1    # ranks computing at once when the compute was measured ...
    measured_cores: float = 1  # ... on this many cores
    wire_level: int = 0        # traffic across this level or above waits on a network link, off the cores; below
                               # it (inside a node) gloo moves the bytes through the cores

    @property
    def measured_stretch(self) -> float:
        return max(1.0, self.measured_ranks / self.measured_cores)

    def stretch(self, work: float, busy: float, idle: float) -> float:
        """How much slower than alone `work` core-seconds of compute run when the rank also spends `busy` seconds
        of communication on a core and `idle` waiting on wires: each rank is on a core for the same share u of
        the step (the ranks are alike), so 1 + (ranks - 1) u ranks share the cores and each gets cores / that, at
        most one. The fixed point s = max(1, (1 + (N - 1) u) / C), u = (s W + B) / (s W + B + I), in closed form:
        N / C when nothing else happens (the probe's condition), 1 as the waits grow."""
        N, C, W, B = self.ranks, self.cores, work, busy
        if W <= 0 or N <= C:
            return 1.0
        K = busy + idle
        b = C * K - N * W
        s = (-b + math.sqrt(b * b + 4 * C * W * (K + (N - 1) * B))) / (2 * C * W)
        return max(1.0, s)


@dataclass(frozen=True)
class Execution:
    """How a step runs beside what it computes and sends: FSDP2's implicit prefetch (train.prefetch), the cores CPU
    ranks share, and host seconds per step (as measured like the compute: CPU work on CPU, a floor on GPU)."""

    prefetch: bool = True
    cores: Cores | None = None
    host_s: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """The step and its parts: compute (the compute stream busy, processor sharing included) and what the compute
    stream waited for, by group kind and by link level; step_s = compute_s + the exposed seconds."""

    step_s: float
    compute_s: float
    exposed_s: dict = field(default_factory=dict)           # by group kind
    exposed_by_level_s: dict = field(default_factory=dict)  # by level name (node, leaf, spine, ...)
    stretch: float = 1.0                                    # processor sharing's slow-down of the compute on CPU
    phases_s: dict = field(default_factory=dict)            # forward, backward (until the last reduction lands),
                                                            # optimizer, aggregation: as result.json's phases time them


class _Timeline:
    """The resources' next free times and what the compute stream (on CPU: the rank's one thread) did."""

    def __init__(self, gpu: bool):
        self.gpu = gpu
        self.free: dict = {}
        self.cursor = 0.0  # when the compute stream is next free
        self.compute = 0.0
        self.exposed: dict[str, float] = {}
        self.by_level: dict[str, float] = {}

    def _book(self, comm: Comm, seconds: float) -> None:
        if seconds > 0:
            self.exposed[comm.kind] = self.exposed.get(comm.kind, 0.0) + seconds
            self.by_level[comm.level] = self.by_level.get(comm.level, 0.0) + seconds

    def ready(self, wait: float) -> float:
        """When a compute op waiting for a collective ending at `wait` can start."""
        return wait if wait > self.cursor else self.cursor

    def compute_op(self, seconds: float, wait: float = 0.0, waited: Comm | None = None) -> tuple[float, float]:
        """Compute after the collective `waited` (ending at `wait`), to which the stream's idle time is booked."""
        start = self.cursor
        if wait > start:
            self._book(waited, wait - start)
            start = wait
        self.cursor = start + seconds
        self.compute += seconds
        return start, self.cursor

    def comm_op(self, comm: Comm | None, after: float, stream: str) -> float:
        """A collective issued on `stream`, ready at `after`; returns its end. On CPU (gloo) it blocks the rank."""
        if comm is None or comm.seconds <= 0:
            return after
        if not self.gpu:
            return self.blocking(comm, after)
        free = self.free
        start = free.get(stream, 0.0)
        if after > start:
            start = after
        for lv in comm.levels:
            t = free.get(lv, 0.0)
            if t > start:
                start = t
        end = start + comm.seconds
        free[stream] = end
        for lv in comm.levels:
            free[lv] = end
        return end

    def blocking(self, comm: Comm | None, after: float = 0.0) -> float:
        """A collective on the compute stream's path (tensor, pipeline, federation; every one on CPU): it waits for
        its links, and the stream waits for it."""
        if comm is None or comm.seconds <= 0:
            return self.cursor
        free, start = self.free, max(self.cursor, after)
        for lv in comm.levels:
            t = free.get(lv, 0.0)
            if t > start:
                start = t
        end = start + comm.seconds
        for lv in comm.levels:
            free[lv] = end
        self._book(comm, end - self.cursor)
        self.cursor = end
        return end


def _scaled(comm: Comm | None, times: float) -> Comm | None:
    return None if comm is None or times <= 0 else Comm(comm.seconds * times, comm.kind, comm.levels)


def _stretch(units: list[Unit], optimizer_s: float, pipe: Pipeline, extra: list[Comm], how: Execution,
             gpu: bool) -> tuple[float, float]:
    """(processor sharing's slow-down of the measured compute, that slow-down over the measurement's): 1 on GPU."""
    cores = how.cores
    if gpu or cores is None:
        return 1.0, 1.0
    bubble = pipe.slots / pipe.microbatches
    work = (sum(u.forward_s + u.backward_s for u in units) * bubble + optimizer_s + how.host_s) / cores.measured_stretch
    comms = [c for u in units for c in (u.gather, u.gather if u.regather else None, u.reduce, u.replicate) if c]
    comms += extra + ([_scaled(pipe.send, 2 * pipe.slots)] if pipe.send else [])
    busy = sum(c.seconds for c in comms if c.levels and max(c.levels) < cores.wire_level)
    idle = sum(c.seconds for c in comms) - busy
    s = cores.stretch(work, busy, idle)
    return s, s / cores.measured_stretch


def run(units: list[Unit], optimizer_s: float, gpu: bool, how: Execution = Execution(), pipe: Pipeline = Pipeline(),
        tensor: Comm | None = None, federation: tuple[Comm, ...] = ()) -> Schedule:
    """One step of one rank: `units` in forward order, the optimizer's seconds, on GPU (streams beside compute) or
    CPU (gloo: every collective blocks); `tensor`: the step's tensor-parallel traffic, spread over the compute in
    proportion to it; `federation`: the exchange's collectives, each already divided by A."""
    stretch, f = _stretch(units, optimizer_s, pipe, [c for c in (tensor, *federation) if c], how, gpu)
    t = _Timeline(gpu)
    m, rest = pipe.microbatches, pipe.slots - 1  # the first microbatch's slot unit by unit, the others whole
    total = sum(u.forward_s + u.backward_s for u in units) * pipe.slots / m
    tp_per_s = tensor.seconds / total if tensor and total > 0 else 0.0

    def work(seconds: float, wait: float = 0.0, waited: Comm | None = None) -> tuple[float, float]:
        """Compute, then its share of the tensor-parallel traffic on the path."""
        span = t.compute_op(seconds * f, wait, waited)
        if tp_per_s:
            t.blocking(Comm(seconds * tp_per_s, tensor.kind, tensor.levels))
        return span

    # forward: the first slot unit by unit, each unit's all-gather before its compute
    last = 0.0  # start of the previous compute op
    for u in units:
        ready = last if how.prefetch else t.cursor  # unprefetched: issued behind all the stream holds
        last, _ = work(u.forward_s / m, t.comm_op(u.gather, ready, "gather"), u.gather)
    if tensor and not tp_per_s:  # no compute to spread it over
        t.blocking(tensor)
    t.blocking(pipe.send)
    if rest:
        work(sum(u.forward_s for u in units) * rest / m)
        t.blocking(_scaled(pipe.send, rest))
    forward = t.cursor
    if rest:
        work(sum(u.backward_s for u in units) * rest / m)
        t.blocking(_scaled(pipe.send, rest))
    # backward, units in reverse: the last slot unit by unit
    back = units[::-1]
    prefetched = -1.0  # end of the gather prefetched for the next unit
    landed, last_reduce = 0.0, None  # when the last reduction lands, and which
    for k, u in enumerate(back):
        wait = 0.0
        if u.regather and u.gather:
            wait = prefetched if prefetched >= 0 else t.comm_op(u.gather, t.cursor, "gather")
        prefetched = -1.0
        nxt = back[k + 1] if k + 1 < len(back) else None
        if how.prefetch and nxt is not None and nxt.regather and nxt.gather:  # issued at this unit's pre-backward
            prefetched = t.comm_op(nxt.gather, t.ready(wait), "gather")
        _, done = work(u.backward_s / m, wait, u.gather)
        for comm, stream in ((u.reduce, "reduce"), (u.replicate, "replicate")):
            if comm is not None and comm.seconds > 0:
                done = t.comm_op(comm, done, stream)
                if done >= landed:
                    landed, last_reduce = done, comm
    t.blocking(pipe.send)
    start, end = t.compute_op((optimizer_s + (0.0 if gpu else how.host_s)) * f, landed, last_reduce)
    for comm in federation:
        t.blocking(comm)
    phases = {"forward": forward, "backward": start - forward, "optimizer": end - start, "aggregation": t.cursor - end}
    if gpu and how.host_s > t.cursor:  # the host issues the step slower than the device runs it
        t.exposed["host"] = phases["host"] = how.host_s - t.cursor
        t.cursor = how.host_s
    return Schedule(t.cursor, t.compute, t.exposed, t.by_level, stretch, phases)
