"""DiLoCo's outer optimizer on top of FedAvg (train.outer=diloco), on each rank's own shards; the compressed
(train.aggregation_dtype) and streamed (train.outer_fragments, train.outer_delay) exchanges that need its
synchronized copy.

Every rank keeps the last synchronized copy of its shards (`synced`, fp32) and the outer momentum, both
shard-sized: nothing is gathered. With train.outer_offload they live in pinned host memory, and each outer step
brings a tensor's pair to the device with non-blocking copies, updates it there and sends it back the same way:
the host never computes or waits. The groups'
pseudo-gradients synced − local are averaged into Δ, and Nesterov SGD gives

    m ← μ m + Δ,    synced ← synced − lr (Δ + μ m) = average + (1 − lr) Δ − lr μ m.

Plain (fp32, whole shard, no delay): every A steps FedAvg averages the parameters in place (fp32
accumulation; in FL+HSDP each replica reduces 1/R, then the replicas gather: train.federation.federated), and since
`synced` is the
same in every group Δ = synced − average; the update is written in the second form so that FedAvg is
exactly the case lr = 1, μ = 0 (the correction is zero and adds no rounding).

Otherwise the pseudo-gradients themselves travel (small, centred values that quantise well: train.federation.compress),
and FedAvg is DiLoCo at lr = 1, μ = 0. Streamed (Streaming DiLoCo): the parameters are cut into N
fragments of about equal size, in model order; one fragment is launched every A/N steps, so each is synced
every A steps, and its exchange may run in a background thread while the next τ inner steps train
(train.outer_delay). When it lands, the new synchronized fragment replaces the local one, plus what the
τ steps since the launch changed locally. Every group and replica computes the same update from the same
averaged values, so the outer step sends nothing beyond the exchange.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from train.federation import compress
from train.federation.compress import all_gather
from train.federation.federated import FedAvg
from train.federation.inflight import Exchange as Stages
from train.federation.inflight import InFlight, launched, together
from train.parallel.parallelize import local


@dataclass
class Exchange:
    """One fragment's exchange in flight: its chunks of tensor indices, this rank's own pseudo-gradients
    (kept to merge the local progress made while it travelled) and the averages of this replica's share of them
    in flight (all of them without replicas)."""
    chunks: list[list[int]]
    own: list[torch.Tensor]
    averaged: InFlight | None
    lands_after: int


@dataclass(frozen=True)
class OuterStep:
    """The outer optimizer's settings: Nesterov SGD at `lr` and `momentum` on the pseudo-gradients (lr 1,
    momentum 0: FedAvg), sent as `wire` (fp32, bf16, int8), in `fragments` rotating every A / fragments steps, each
    landing `delay` steps after its launch; `offload` keeps the synchronized copy and momentum in host memory."""
    lr: float
    momentum: float
    offload: bool = False
    wire: str = "fp32"
    fragments: int = 1
    delay: int = 0


class DiLoCo(FedAvg):
    def __init__(self, model, optimizer, mesh, A: int, outer: OuterStep,
                 whole: list[tuple[str, int]] | None = None, **fedavg):
        super().__init__(model, optimizer, mesh, A, **fedavg)
        self.lr, self.momentum, self.wire, self.delay, self.offload = (outer.lr, outer.momentum, outer.wire,
                                                                       outer.delay, outer.offload)
        fragments = outer.fragments
        self.synced = [self._home(local(p).detach().to(torch.float32, copy=True)) for _, p in self.named_params()]
        self.velocity = [self._home(torch.zeros_like(s, device=local(p).device))
                         for s, (_, p) in zip(self.synced, self.named_params())]
        self.fragments = fragments_of([name for name, _ in self.named_params()],
                                      whole or [(name, p.numel()) for name, p in self.named_params()], fragments)
        self.period = A // fragments  # steps between two launches
        self.streamed = fragments > 1 or self.delay > 0
        self.pending: Exchange | None = None

    def _home(self, t: torch.Tensor) -> torch.Tensor:
        """Where a synchronized copy or momentum lives: with the parameters, or pinned in host memory (offload
        from a GPU), so that copies both ways are asynchronous."""
        return t.to("cpu").pin_memory() if self.offload and t.device.type == "cuda" else t

    def _fetch(self, i: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensor i's synchronized copy and momentum on the parameters' device (themselves unless offloaded)."""
        return (self.synced[i].to(device, non_blocking=True), self.velocity[i].to(device, non_blocking=True))

    def _store(self, i: int, synced: torch.Tensor, velocity: torch.Tensor) -> None:
        """Send an offloaded pair back to host memory, in stream order (the next fetch reads it after)."""
        if synced is not self.synced[i]:
            self.synced[i].copy_(synced, non_blocking=True)
            self.velocity[i].copy_(velocity, non_blocking=True)

    def due(self, steps_done: int) -> bool:
        return steps_done % self.period == 0

    def after_step(self, steps_done: int) -> bool:
        if not self.streamed:
            return super().after_step(steps_done)
        acted = False
        if self.pending is not None and not self.clock.cuda:
            self.clock.poll()  # the exchange in flight: has gloo completed it (no wait)?
        if self.pending is not None and self.pending.lands_after == steps_done:
            self._land()
            acted = True
        if self.due(steps_done):
            self._launch(self.fragments[(steps_done // self.period - 1) % len(self.fragments)], steps_done)
            acted = True
            if not self.delay:
                self._land()
        return acted

    def flush(self) -> None:
        """Land the exchange in flight now (before a checkpoint or the final average)."""
        if self.pending is not None:
            self._land()

    def in_sync_after(self, steps_done: int) -> bool:
        return not self.streamed and super().in_sync_after(steps_done)

    def average(self) -> None:
        """Every fragment at once, landed at once: the plain outer step (and the final one of a streamed run)."""
        self.flush()
        if self.wire == "fp32" and not self.streamed:
            super().average()
            self.outer_step_from_average()
            return
        self._launch(list(range(len(self.synced))), None)
        self._land()

    def _launch(self, indices: list[int], steps_done: int | None) -> None:
        if not self.checked:
            self.check_alignment(contents=False)
        self.event_bytes = 0
        chunks, own = self.pseudo_gradients(indices, self.F * self.R)
        shares = [delta.view(self.R, -1)[self.replica] for delta in own]  # the whole of each without replicas
        self.pending = Exchange(chunks, own, InFlight(self._exchange(shares), self.clock),
                                (steps_done or 0) + self.delay)

    @torch.no_grad()
    def pseudo_gradients(self, indices: list[int], pieces: int) -> tuple[list[list[int]], list[torch.Tensor]]:
        """The tensors `indices` in chunks (their indices) and each chunk's synced - local in fp32, zero-padded to
        a length that cuts into `pieces` pieces of whole int8 blocks (train.federation.compress.padded)."""
        params = [local(p) for _, p in self.named_params()]
        chunks, own, taken = [], [], 0
        for chunk in self._chunks([self.synced[i] for i in indices]):
            index, taken = indices[taken:taken + len(chunk)], taken + len(chunk)
            size = sum(self.synced[i].numel() for i in index)
            delta = params[index[0]].new_zeros(compress.padded(size, pieces), dtype=torch.float32)
            torch.cat([(self.synced[i].to(params[i].device, non_blocking=True) - params[i].float()).reshape(-1)
                       for i in index], out=delta[:size])
            chunks.append(index)
            own.append(delta)
        return chunks, own

    def _exchange(self, own: list[torch.Tensor]) -> Stages:
        """The mean over the groups of this replica's share of each pseudo-gradient chunk, side by side."""
        means = yield from together([self._mean(delta) for delta in own])
        self.event_bytes += sum(sent for _, sent in means)
        return [mean for mean, _ in means]

    def _mean(self, delta: torch.Tensor) -> Stages:
        """One chunk's mean over the groups and the bytes this rank sent for it."""
        if self.wire != "fp32":
            return (yield from compress.mean_over(delta, self.F, self.fed_group, self.wire))
        total = delta.clone()
        yield from launched(lambda: [dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.fed_group,
                                                     async_op=True)])
        return total.div_(self.F), 2 * total.numel() * 4 * (self.F - 1) // self.F

    def _land(self) -> None:
        pending, self.pending = self.pending, None
        averaged = pending.averaged.result()
        params = [local(p) for _, p in self.named_params()]
        with torch.no_grad():
            for index, share, own in zip(pending.chunks, averaged, pending.own):
                mean = share
                if self.R > 1:  # every replica averaged its share: put them together
                    mean = torch.empty_like(own)
                    all_gather(mean, share, group=self.rep_group)
                self.step_on_mean(index, mean, own, params)

    @torch.no_grad()
    def step_on_mean(self, index: list[int], mean: torch.Tensor, own: torch.Tensor | None,
                     params: list[torch.Tensor]) -> None:
        """The outer step of the tensors `index` (a chunk) on `mean`, the groups' mean pseudo-gradient of the chunk;
        `own`: this group's own pseudo-gradient at the launch, read only when the exchange was delayed (it keeps
        what the steps since then did locally); `params`: the local shards of every parameter."""
        # a non-finite mean (some group's values went NaN or inf) moves nothing: the next comparison of
        # the ranks' non-finite notes stops the run (train.federation.federated)
        mean = torch.where(torch.isfinite(mean).all(), mean, torch.zeros_like(mean))
        sizes = [self.synced[i].numel() for i in index]
        owns = own[:sum(sizes)].split(sizes) if self.delay else [None] * len(index)
        for i, d, mine in zip(index, mean[:sum(sizes)].split(sizes), owns):
            p = params[i]
            s, m = self._fetch(i, p.device)
            d = d.view_as(s)
            # keep what the steps since the launch did locally: p += new - (synced - own)
            moved = mine.view_as(s) - s if self.delay else None
            m.mul_(self.momentum).add_(d)
            s.add_(d, alpha=-self.lr).add_(m, alpha=-self.lr * self.momentum)  # s - lr (d + mu m)
            if moved is None:
                p.copy_(s)
                s.copy_(p)  # what every group starts from: rounded to the parameters' dtype
            else:
                p.copy_(p.float().add_(moved.add_(s)))
            self._store(i, s, m)

    def outer_step_from_average(self) -> None:
        """After FedAvg put the average a in the parameters: m <- mu m + (synced - a), then parameters <-
        a + (1 - lr)(synced - a) - lr mu m (module docstring) and synced <- parameters; five passes over
        memory and no temporary for fp32 parameters (updated in place; others through an fp32 copy)."""
        with torch.no_grad():
            for i, (_, param) in enumerate(self.named_params()):
                p = local(param)
                s, m = self._fetch(i, p.device)
                work = p if p.dtype == torch.float32 else p.float()
                torch.add(s, m, alpha=self.momentum, out=m).sub_(work)  # m <- mu m + (s - a)
                work.lerp_(s, 1 - self.lr).add_(m, alpha=-self.lr * self.momentum)
                if work is not p:
                    p.copy_(work)
                s.copy_(p)  # what every group starts from: the update rounded to the parameters' dtype
                self._store(i, s, m)

    def outer_state(self) -> dict:
        """The synchronized copy and the momentum as DTensors laid out like the parameters, for checkpoints
        (identical in every group, so stored once) and for the alignment guard. Offloaded tensors are copied
        to the parameters' device; `load_outer_state` copies loaded values back."""
        out: dict = {"synced": {}, "momentum": {}}
        for (name, p), synced, m in zip(self.named_params(), self.synced, self.velocity):
            for key, t in (("synced", synced), ("momentum", m)):
                t = t.to(local(p).device, non_blocking=True)
                out[key][name] = DTensor.from_local(t, p.device_mesh, p.placements, run_check=False,
                                                    shape=p.shape, stride=p.stride()) if isinstance(p, DTensor) else t
        return out

    def device_state(self) -> list[torch.Tensor]:
        """What this keeps on the device between outer steps (nothing when offloaded): the dry-run counts it."""
        return [] if self.offload else self.synced + self.velocity

    def load_outer_state(self, state: dict) -> None:
        for (name, _), synced, m in zip(self.named_params(), self.synced, self.velocity):
            synced.copy_(local(state["synced"][name]))
            m.copy_(local(state["momentum"][name]))

    def guarded(self) -> list[tuple[str, torch.Tensor]]:
        state = self.outer_state()
        return super().guarded() + [(f"outer.{key}.{name}", t) for key in state for name, t in state[key].items()]


def fragments_of(names: list[str], whole: list[tuple[str, int]], n: int) -> list[list[int]]:
    """The indices into `names` (this rank's parameters) of each of the n fragments, cut from the whole model's
    (name, global numel) list: a pipeline stage holds only some parameters, and its fragments must be the same
    parameters as in every other layout (a fragment may hold none of a stage's)."""
    fragment = {whole[i][0]: k for k, run in enumerate(split([numel for _, numel in whole], n)) for i in run}
    return [[i for i, name in enumerate(names) if fragment[name] == k] for k in range(n)]


def split(numels: list[int], n: int) -> list[list[int]]:
    """n runs of consecutive tensor indices of about equal total size (by global numel, so every rank and the
    single-process reference cut alike); each run holds at least one tensor."""
    total, out, start, acc = sum(numels), [], 0, 0
    for k in range(1, n + 1):
        end = start
        while end < len(numels) - (n - k) and (end == start or acc + numels[end] / 2 <= total * k / n):
            acc += numels[end]
            end += 1
        out.append(list(range(start, end if k < n else len(numels))))
        start = end
    return out
