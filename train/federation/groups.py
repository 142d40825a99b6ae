"""FedAvg over the federation groups a torchft quorum holds (train.fault_tolerance=groups, issue 56): each group is
its own world of R x S ranks, so a lost group ends only its own process tree, and the others go on averaging among
themselves.

Every A steps each rank asks the Lighthouse for a quorum (train.federation.lighthouse). The quorum forms once
train.quorum_min groups have asked and either every live group has, or train.grace_s has passed: a dead group stops
heart-beating and is left out within a few seconds, a late one after the grace window. A group that is behind the
quorum's step (restarted after a loss, or late) heals there: torchft copies a live peer's parameters, AdamW moments
and train state (step, tokens, LR schedule, RNG) into it, so it goes on exactly where its peer stands, and its own
work since the last average is dropped. Healing rather than merging a late update with a staleness weight: the
late group's update is A steps stale by construction, and torchft's recovery gives the exact state a fault-free
group would hold, which the tests can check bit for bit.

Each rank then averages its local shards with the same shard of the other groups in the quorum (the same rank of
each group's world: the layouts are equal), weighted by the tokens each group trained since the last average (a
group that just healed holds a copy and weighs 0), summed in fp32, and writes the average back only when every group
commits (torchft's should_commit: no rank of any group failed in the exchange) and it is finite. With
train.outer=diloco the outer step then runs on that average (train.federation.outer's, on this group's synchronized
copy and momentum, which a healing group copies too). With train.aggregation_dtype bf16 or int8 the token-weighted
pseudo-gradients travel instead, encoded, and are added in fp32 by the quorum member that owns each piece
(train.federation.compress, over the process group torchft rebuilds for each quorum); the outer step (lr 1, momentum
0 for FedAvg) runs on their sum.
"""
from __future__ import annotations

import socket
import time
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torch.distributed.distributed_c10d import AllgatherOptions, AllToAllOptions

from train.contract.common import FedshardError
from train.federation import compress
from train.federation.alignment import any_rank
from train.federation.federated import FedAvg
from train.federation.inflight import run
from train.federation.outer import DiLoCo, OuterStep
from train.parallel.parallelize import local


class GroupFedAvg(FedAvg):
    """FedAvg through torchft's quorum; `join()` at the start heals a group that comes late or restarted."""

    def __init__(self, model, optimizer, mesh, spec, seat, train_state, outer: OuterStep | None = None):
        """`seat` (train.runtime.launch_env.Seat): this rank's group and the Lighthouse; `train_state`: what a healing
        group takes besides the model and optimizer (step, tokens, LR schedule, RNG); `outer`: DiLoCo's outer step
        after each average (None: FedAvg)."""
        L, t = spec.layout, spec.train
        super().__init__(model, optimizer, mesh, L.A, t.average_optimizer_state)
        self.wire = t.aggregation_dtype
        if outer is None and self.wire != "fp32":  # compressed FedAvg is DiLoCo at lr 1, momentum 0
            outer = OuterStep(1, 0)
        # DiLoCo: its synchronized copy, momentum and outer step (its own averaging, over a fed dimension of 1, unused)
        self.outer = DiLoCo(model, optimizer, mesh, L.A, outer) if outer is not None else None
        self.groups = L.F  # in the run (this rank's mesh holds one: its own)
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        self.group, self.train_state = seat.group, train_state
        self.tokens_per_step = L.R * L.S * t.batch_per_rank * t.seq_len  # this group's
        self.trained_since = 0  # this group's own steps since it last averaged or healed
        self.healed = False
        self.trained_tokens = 0  # tokens this group trained in this process, kept or dropped
        self.merged_tokens = 0  # of those, the ones an average took in
        self.heals: list[dict] = []  # {step, at, dropped_tokens}: where this group took a peer's state
        self.last_round = 0  # groups in the last average this group took part in
        self.stateless_in_round = 0.0  # of those, groups started again that had not healed yet
        self.restarted = seat.start > 0  # a life after a loss: it must heal before it trains
        self.waiting = False  # rounds that only wait for groups: after the last step (finish), or to heal (join)
        self.timeout_s = t.timeout_s  # how long closing rounds wait for a missing group
        self.grace_s = t.grace_s  # how long a quorum missing live groups waits for them (the Lighthouse's join timeout)
        self.left_out = 0  # groups missing from the round the closing rounds ended with
        self.short_rounds: list[dict] = []  # {step, groups}: averages some group missed
        wait, lighthouse = timedelta(seconds=t.timeout_s), seat.lighthouse
        # where peers reach this group: loopback when the Lighthouse is (cluster=local), else this node's name
        host = "127.0.0.1" if urlparse(lighthouse).hostname == "127.0.0.1" else socket.gethostname()
        self.quorum = ProcessGroupGloo(timeout=wait)  # torchft reconfigures it over each round's quorum
        self.manager = Manager(
            pg=self.quorum, load_state_dict=self._load, state_dict=self._state,
            min_replica_size=t.quorum_min, use_async_quorum=False, rank=dist.get_rank(),
            world_size=dist.get_world_size(), replica_id=f"group{seat.group}", lighthouse_addr=lighthouse, timeout=wait,
            quorum_timeout=wait, init_sync=False, hostname=host, checkpoint_transport=_transport(host, wait))

    def check_alignment(self, contents: bool) -> None:
        """The groups live in separate worlds: they start from one seed, and `join()` heals one that does not."""
        self.checked = True

    def join(self) -> None:
        """Enter the federation (collective across the quorum): a fresh run's groups agree on step 0, a restarted
        or late group heals from a live peer at the others' next average and takes part in it. torchft heals a
        group whose step is behind the quorum's, and counts steps per process from 0: its count starts here at this
        group's training step, so groups resumed from a checkpoint stand ahead of one restarted from nothing.

        A restarted group that did not heal found no one ahead: either every group stands at step 0 (an attempt
        restarted a group before any trained), which a round holding all of them, some never restarted, shows; or
        its quorum held only groups restarted like it (two lost at once, a majority together) while the others
        train on. It asks again, its count put back (a round counts a step), until it heals or every group is in
        its round; never training on from nothing, which its peers' next average would take in as a trained model.
        Every group restarted and none healed: nothing of the run is left to heal from, and it fails, so that a
        retry of the run resumes from the groups' checkpoint instead of training again from step 0."""
        self.waiting = self.restarted
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.manager.load_state_dict({**self.manager.state_dict(), "step": self.train_state.step})
            self.average()
            if not self.restarted or self.heals:
                break
            if self.last_round == self.groups:
                if self.stateless_in_round == self.groups:
                    raise FedshardError(f"federation group {self.group} was started again, as was every other group: "
                                        f"none holds the run's state to heal from (a retry of the run resumes from the "
                                        f"step the groups all checkpointed)")
                break
            if any_rank(time.monotonic() > deadline, self.device):
                raise FedshardError(f"federation group {self.group} was started again but no group still training "
                                    f"was ahead of it to heal from within train.timeout_s={self.timeout_s:g} s")
            # not at once: the groups it met would form their next round alone at once. Within half the grace
            # window, a peer asking meanwhile waits for them (a quorum missing live groups waits train.grace_s)
            time.sleep(self.grace_s / 2)
        self.waiting = False

    def after_step(self, steps_done: int) -> bool:
        self.trained_since += 1
        self.trained_tokens += self.tokens_per_step
        return super().after_step(steps_done)

    def finish(self) -> None:
        """After the last step: join averages (weight 0: nothing is trained any more) until one holds every group,
        so that a late group heals to the final model there instead of training on alone once the others have
        left, and every group ends holding the same model. A group still missing train.timeout_s after the first
        closing round (its new job never started: its node stays down and no other is free) is left out: the groups
        of that round agree to leave together, and the launcher cancels its job (launcher.actions.groups)."""
        self.waiting = True
        deadline = time.monotonic() + self.timeout_s
        while self.last_round < self.groups:
            # the group's ranks decide together: their clocks differ, and a rank leaving alone would leave the others
            # asking torchft for a round it never forms without it
            if self.average(leave=any_rank(time.monotonic() > deadline, self.device)):
                self.left_out = self.groups - self.last_round
                return

    def average(self, leave: bool = False) -> bool:
        """One round over the quorum; True when it committed and some group in it asked to `leave` (its closing
        rounds waited long enough for a missing group)."""
        start = self.clock.mark()
        self.manager.start_quorum()  # heals this group here (self._load) when it is behind
        own = 0 if self.healed else self.trained_since
        step = self.train_state.step
        self.healed, self.trained_since = False, 0
        groups = self.last_round = self.manager.num_participants()
        stateless = self.restarted and not self.heals  # started again and not healed yet: it holds nothing of the run
        asked = torch.tensor([float(own), float(leave), float(stateless)], dtype=torch.float64)
        self.manager.allreduce(asked, reduce_op=ReduceOp.SUM).wait()
        # read on the host, once per average (a step that aggregates): whether anything was trained since the last
        # one, this group's weight in the sums, whether a closing group asked to leave, and how many of the round's
        # groups hold nothing of the run (a restarted group's join)
        total, leaving, self.stateless_in_round = asked.tolist()
        exchanged = []
        if total > 0:  # a closing round (nothing trained) sends nothing: the last event's bytes stand
            self.event_bytes = 0
            exchanged = self._compressed_means(own / total) if self.wire != "fp32" else self._weighted_sums(own / total)
        committed = self.manager.should_commit()  # once per round: no rank of any group in the quorum failed in it
        if committed:
            self._apply(exchanged)  # nothing trained (a closing round): nothing moves
            self.merged_tokens += own * self.tokens_per_step
            if groups < self.groups and not self.waiting:
                self.short_rounds.append({"step": step, "groups": groups})
        self.clock.span(start, self.clock.mark())
        return committed and leaving > 0

    def _apply(self, exchanged: list) -> None:
        """The committed round's average into the parameters, and DiLoCo's outer step on it."""
        if self.wire != "fp32":
            params = [local(p) for _, p in self.named_params()]
            for index, mean in exchanged:
                self.outer.step_on_mean(index, mean, None, params)
            return
        self._write_back(exchanged)
        if self.outer is not None and exchanged:
            self.outer.outer_step_from_average()

    @torch.no_grad()
    def _weighted_sums(self, weight: float) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        """(tensors, the weighted sum of their values over the quorum in fp32), chunk by chunk."""
        sums = []
        for chunk in self._chunks(self.tensors()):
            flat = torch.cat([t.reshape(-1).float() for t in chunk]).mul_(weight)
            self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            self.event_bytes += 2 * flat.numel() * flat.element_size()
            sums.append((chunk, flat))
        return sums

    @torch.no_grad()
    def _compressed_means(self, weight: float) -> list[tuple[list[int], torch.Tensor]]:
        """(a chunk's tensor indices, the quorum's weighted mean of its pseudo-gradients), chunk by chunk:
        weight x (synced - local) travels encoded as train.aggregation_dtype and is added in fp32
        (train.federation.compress) over the quorum's process group. A peer lost in the exchange is reported to
        torchft, whose should_commit then drops the round in every group."""
        if self.manager.errored() is not None:  # the round already failed (its quorum or weights): nothing travels
            return []
        members = self.quorum.size()  # the groups in this round's quorum
        chunks, deltas = self.outer.pseudo_gradients(list(range(len(self.outer.synced))), members)
        via = compress.Collectives(  # the two of them gloo also runs on CUDA tensors
            lambda out, inp: self.quorum.alltoall_base(out, inp, [], [], AllToAllOptions()),
            lambda out, inp: self.quorum.allgather([list(out.view(-1, inp.numel()).unbind(0))], [inp],
                                                   AllgatherOptions()))
        means = []
        for index, delta in zip(chunks, deltas):
            try:
                mean, sent = run(compress.summed(delta.mul_(weight), members, self.wire, via))
            except Exception as error:  # noqa: BLE001 (what torchft's own allreduce does: the round is dropped)
                self.manager.report_error(error)
                return []
            self.event_bytes += sent
            means.append((index, mean))
        return means

    @torch.no_grad()
    def _write_back(self, sums: list[tuple[list[torch.Tensor], torch.Tensor]]) -> None:
        """Each tensor <- its average, where finite (a group's non-finite values would spread: each keeps its own)."""
        for chunk, flat in sums:
            finite = torch.isfinite(flat).all()
            for t, value in zip(chunk, flat.split([t.numel() for t in chunk])):
                t.copy_(torch.where(finite, value.view_as(t).to(t.dtype), t))

    def outer_state(self) -> dict:
        return self.outer.outer_state() if self.outer is not None else {}

    def load_outer_state(self, state: dict) -> None:
        self.outer.load_outer_state(state)

    def device_state(self) -> list:
        return self.outer.device_state() if self.outer is not None else []

    def _state(self) -> dict:
        """What a healing peer takes: this rank's shards, their AdamW moments, the train state and, with DiLoCo, the
        synchronized copy and outer momentum."""
        params = [p for _, p in self.named_params()]
        moments = [{k: local(v).detach().clone() if torch.is_tensor(v) else v
                    for k, v in self.optimizer.state.get(p, {}).items()} for p in params]
        return {"params": [local(p).detach().clone() for p in params], "moments": moments,
                "train": self.train_state.state_dict(), "outer": [t.clone() for t in self._outer_tensors()]}

    def _outer_tensors(self) -> list[torch.Tensor]:
        """DiLoCo's synchronized copy and momentum, in one order on every group; none for FedAvg."""
        return [] if self.outer is None else [*self.outer.synced, *self.outer.velocity]

    def _load(self, state: dict) -> None:
        with torch.no_grad():
            for (_, p), value, moments in zip(self.named_params(), state["params"], state["moments"]):
                local(p).copy_(value)
                mine = self.optimizer.state[p]  # empty in a group restarted from nothing
                for k, v in moments.items():
                    if not torch.is_tensor(v):
                        mine[k] = v
                        continue
                    if k not in mine:  # a moment is laid out as its parameter (a DTensor shard); a step is a scalar
                        mine[k] = torch.zeros_like(p) if v.dim() else v.clone()
                    local(mine[k]).copy_(v)
            for t, value in zip(self._outer_tensors(), state["outer"], strict=True):
                t.copy_(value)
        dropped = self.trained_since * self.tokens_per_step  # this group's steps since its last average
        self.train_state.load_state_dict(state["train"])
        self.healed = True
        self.heals.append({"step": self.train_state.step, "at": time.time(), "dropped_tokens": dropped})

    def summary(self) -> dict:
        """This group's part of result.json's `groups` (this process's life: a restarted group writes another)."""
        return {"trained_tokens": self.trained_tokens, "merged_tokens": self.merged_tokens, "heals": self.heals,
                "short_rounds": self.short_rounds, "left_out": self.left_out}

    def close(self) -> None:
        """Collective in the group: the manager server lives in rank 0's process, and a rank still waiting for its
        last reply (the closing round's should_commit) when that process ends gets torchft's "transport error"."""
        dist.barrier()
        self.manager.shutdown(wait=False)


def _transport(host: str, timeout: timedelta):
    """torchft's HTTP transport of a healing peer's state, advertised at `host` (torchft's own names the machine's
    hostname, which need not be loopback)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class HostTransport(HTTPTransport):
        def address(self) -> str:
            return f"http://{host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    return HostTransport(timeout=timeout, num_chunks=0)
