"""The training run: build mesh, model, optimizer and data from a spec; train; evaluate; summarise.

Long: one Trainer, whose step, loop, evaluation and summary share its state (clock, log, checkpointer, outer
step); each piece split off would take the whole Trainer."""
from __future__ import annotations

import math
import os
import socket
import time
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from train import model as models
from train import optim
from train.contract.common import SpecError
from train.contract.machine import describe as describe_machine
from train.contract.result import RankRecord, RunResult, target_crossing
from train.contract.spec import RunSpec
from train.data import sources as data
from train.federation.federated import FedAvg
from train.federation.groups import GroupFedAvg
from train.federation.lighthouse import wait_for_groups
from train.federation.outer import DiLoCo, OuterStep
from train.measure import energy, exposed, metrics, profiling
from train.measure.compile_time import CompileClock
from train.parallel import float8 as fp8
from train.parallel import mesh as meshes
from train.parallel import parallelize, pipeline
from train.parallel.parallelize import clip_grad_norm
from train.runtime import checkpoint, launch_env
from train.runtime import fault as faults
from train.runtime.nonfinite import Guard
from train.runtime.preemption import StopRequest
from train.runtime.watchdog import Watchdog

FULL_INIT_LIMIT = 1_000_000_000  # above this many parameters, "auto" init builds on meta and initialises per shard


class Trainer:
    """One rank's view of a run. `restore()` then `step(i)` is what tests drive; `run()` is the whole thing."""

    def __init__(self, spec: RunSpec, rank: int, device: str, config=None, source=None, out_dir: Path | None = None,
                 launched: launch_env.DistEnv | None = None, mesh=None):
        """Build this rank's part of the run; nothing is loaded or checked across ranks until `restore()`.
        Without `out_dir` (tests, benchmarks) no metrics file is written and no checkpoint is resumed; `mesh`:
        one built already (train.job.dryrun builds it before fake tensors, which init_device_mesh cannot take);
        `launched`: how this rank was started (train.loop.run): its job tag names the watchdog's files, its seat
        the federation group that is its world (train.fault_tolerance=groups; `rank` is then its rank there)."""
        self.spec, self.rank, self.device, self.cfg = spec, rank, device, spec.train
        self.config = config or models.for_device(models.llama_config(spec.model), device, spec.train.precision)
        if device == "cuda":  # train.tf32: recorded in result.json
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = spec.train.tf32
        self.source = source or data.for_run(spec, self.config.vocab_size)
        seat = launched.seat if launched is not None else None
        self.world, self.layout, self.seat = spec.world_size, spec.layout, seat
        run_rank = rank  # in the whole run's grid
        if seat is not None:  # a federation group as its own world (train.federation.groups)
            self.world, run_rank = self.layout.group_world, seat.group * self.layout.group_world + rank
            mesh = meshes.build_group(device, self.layout)
        # whose batches, of how many
        self.data_rank, self.data_world = self.layout.data_rank(run_rank), self.layout.dp_world
        # who splits the evaluation: the run's data-parallel ranks, or one group's, which is its own world
        self.eval_rank, self.eval_world = (self.data_rank, self.data_world) if seat is None else \
            (self.layout.data_rank(rank), self.layout.dp_world // self.layout.F)
        self.rows, self.global_batch = data.rank_rows(spec, self.data_rank), data.global_batch(spec)
        self.mesh = mesh if mesh is not None else meshes.build(device, self.layout)
        self.coord = self.layout.coords(run_rank)  # (f, r, s, p, t)
        whole = models.build(self.config, "meta")  # the whole model, every stage
        self.params = models.count_params(whole)
        self.model = self._build_model()
        self.pipeline = None  # train.pp > 1: this rank's stage under its schedule
        if self.layout.P > 1:
            c = self.cfg
            self.pipeline = pipeline.Pipeline(self.model, self.mesh, spec.microbatches, c.pp_schedule, device,
                                              c.batch_per_rank, c.seq_len, c.precision)
        self.optimizer = optim.adamw(self.model.parameters(), self.cfg, fused=device == "cuda")
        self.schedule = optim.schedule(self.optimizer, self.cfg)
        self.state = checkpoint.TrainState(self.schedule)
        # a group that is its own world keeps its own checkpoints, in its own folder
        self.checkpointer = checkpoint.Checkpointer(spec, rank, out_dir / "checkpoints" if seat and out_dir else None)
        self.fedavg = None  # what runs every A steps: FedAvg, or DiLoCo (FedAvg and an outer step)
        if spec.federated:
            shared = {"average_optimizer_state": self.cfg.average_optimizer_state}
            c = self.cfg
            if seat is not None:
                outer = OuterStep(c.outer_lr, c.outer_momentum, c.outer_offload) if c.outer == "diloco" else None
                self.fedavg = GroupFedAvg(self.model, self.optimizer, self.mesh, spec, seat, self.state, outer)
            elif c.outer == "fedavg" and c.aggregation_dtype == "fp32" and not c.streamed:
                self.fedavg = FedAvg(self.model, self.optimizer, self.mesh, spec.layout.A, **shared)
            else:  # compressed or streamed FedAvg is DiLoCo at lr 1, momentum 0: pseudo-gradients travel
                lr, momentum = (c.outer_lr, c.outer_momentum) if c.outer == "diloco" else (1, 0)
                outer = OuterStep(lr, momentum, c.outer_offload, c.aggregation_dtype, c.outer_fragments, c.outer_delay)
                self.fedavg = DiLoCo(self.model, self.optimizer, self.mesh, spec.layout.A, outer,
                                     [(name, p.numel()) for name, p in whole.named_parameters()], **shared)
        # exposed communication: the time each step waits for collectives (None where it cannot be measured)
        self.blocked = exposed.Blocked(device) if exposed.why_not(device, self.layout.T) is None else None
        self.guard = Guard(self.model, self.cfg.on_nonfinite, rank, self.layout, device, self.mesh)
        is_writer = out_dir is not None and rank == 0
        # every last pipeline stage holds its pipeline's loss; the other stages log 0 and are not counted
        self.log = metrics.StepLog(out_dir / "metrics.jsonl" if is_writer else None, self.world // self.layout.P,
                                   device)
        self.out_dir = out_dir
        self.start_step = 0  # where this attempt starts: 0, or the step of the checkpoint `restore()` loads
        self.resumed_at = 0.0  # when restore() had it ready to train (epoch seconds)
        self.apart = {"checkpoint": 0.0, "logging": 0.0, "eval": 0.0, "compile": 0.0}  # outside the training time
        self._in_apart = False  # inside a _timed_apart section, whose clock already moves past a compilation
        self.compile_clock = CompileClock(self._compiled, self._compiling) if self.cfg.compile else None
        self.checkpoints = 0
        self.run_dir = Path(spec.out_dir) if out_dir is not None else None  # a group's out_dir is inside it
        self.fault = faults.Fault.armed(spec, run_rank, self.run_dir)  # train.fault_step: where it strikes
        self.profiler = profiling.StepProfiler(self.cfg.profile, self.cfg.steps, device)
        self.meter: energy.EnergyMeter | None = None  # this node's energy reader, on one rank per node (run())
        self.energy_skips_first = False  # the meter left this attempt's first step out (run's first attempt)
        self.watchdog = None
        if launched is not None and out_dir is not None:
            self.watchdog = Watchdog(rank, self.world, out_dir, launched.job_tag, self.cfg.watchdog_s,
                                     self.cfg.heartbeat_dir)

    def restore(self) -> None:
        """Bring every rank to where the run stands (collective): resume from the latest checkpoint, if
        there is one, timed apart as checkpoint time; else, in a fresh federated run, check that the groups
        are aligned, initial contents included (only meaningful before training makes them differ)."""
        resume_from = self.checkpointer.latest() if self.out_dir is not None else None
        if self.seat is not None:  # groups resume together, from a step they all hold; a restarted group heals
            resume_from = self._common_checkpoint()
        if resume_from is not None:
            with self._timed_apart("checkpoint"):
                self.checkpointer.load(resume_from, self.model, self.optimizer, self.state, self.fedavg)
            self.start_step = self.state.step
            self.log.resume(self.start_step)
            # Groups legitimately differ now: the guard re-checks layouts (not contents) before the next FedAvg.
        elif self.fedavg is not None and self.seat is None:
            self.fedavg.check_alignment(contents=True)
        if self.seat is not None:
            self._join()
        self.resumed_at = time.time()  # where an injected fault's cost ends (train.runtime.fault.record)

    def _common_checkpoint(self) -> Path | None:
        """A fresh start of every group (the job was lost whole) resumes from the newest step all groups hold."""
        if self.seat.start or self.out_dir is None:
            return None
        return self.checkpointer.step_held_by_all([self.run_dir / f"group{g}" / "checkpoints"
                                                   for g in range(self.layout.F)])

    def _join(self) -> None:
        """Enter the federation's quorum: the groups of an attempt first wait for each other (a quorum formed before
        a slow starter would make it heal), a restarted group too, as one lost before it said it was ready holds
        the others until it does (once every group is ready the wait is a file check). A restarted group heals
        there from a live peer and goes on from its step; one restarted before any group trained or resumed finds
        every peer where it stands (train.federation.groups)."""
        if self.run_dir is not None:
            if self.rank == 0:
                wait_for_groups(self.run_dir, self.seat.group, self.layout.F, self.cfg.timeout_s)
            dist.barrier()  # once, before the first step: the group's other ranks wait for its rank 0 to see all
        self.fedavg.join()
        if self.fedavg.heals:
            self.start_step = self.state.step
            self.log.resume(self.start_step)

    def _build_model(self) -> torch.nn.Module:
        dp_mesh = meshes.data_parallel_mesh(self.mesh, self.spec.layout.strategy)
        init = self.cfg.init
        if init == "auto":
            init = "full" if self.params <= FULL_INIT_LIMIT else "meta"
        c = self.cfg
        played = self.device == "cpu" and self.spec.device == "cuda"  # the dry-run plays a CUDA run on CPU
        if c.float8 and not played:
            refused = fp8.why_not(self.device, self.layout.T)
            if refused:
                raise SpecError(refused)
        if init == "full":
            # Every rank builds the same full model from the seed, then keeps its stage and shard.
            torch.manual_seed(c.seed)
            return parallelize.parallelize(models.build(self.config, "cpu"), self.mesh, dp_mesh, c, played)
        model = parallelize.parallelize(models.build(self.config, "meta"), self.mesh, dp_mesh, c, played)
        parallelize.materialize(model, self.device, c.seed, shard_index=self.coord[2], tp_index=self.coord[4])
        return model

    def batch(self, step: int) -> torch.Tensor:
        ids = self.source.train_batch(step, self.rows, self.global_batch, self.cfg.seq_len)
        if self.device == "cuda":  # from pinned memory, queued: a copy from pageable memory waits for the device
            return ids.pin_memory().to(self.device, non_blocking=True)
        return ids.to(self.device)

    def step(self, step: int) -> torch.Tensor:
        """One optimizer step (0-based index) and, when due, FedAvg. Returns the local loss. The phases are marked
        (metrics.PhaseClock), not waited for: the batch's copy to the device counts in the forward."""
        mark = self.log.clock.mark
        marks = [mark()]
        if self.blocked is not None:
            self.blocked.take()  # the waits since the last step (logging, the stop signal) are not this step's
        ids = self.batch(step)
        lr = self.schedule.get_last_lr()[0]
        self._enter("forward", step)
        if self.pipeline is None:
            loss = self.model(input_ids=ids, labels=ids).loss
            marks.append(mark())
            self._enter("backward", step)
            loss.backward()
        else:  # the schedule interleaves the microbatches' forwards and backwards: one phase, named forward
            loss = self.pipeline.step(ids)
            marks.append(mark())
        marks.append(mark())
        self._enter("optimizer", step)
        if self.guard.after_backward(step, loss):  # skip_step: every rank drops this update
            self.state.skipped_steps += 1
        else:
            if self.cfg.max_norm:
                clip_grad_norm(self.model, self.cfg.max_norm, self.mesh["pp"])
            self.optimizer.step()
            if self.cfg.float8_all_gather:
                fp8.after_optimizer_step(self.model)
        self.optimizer.zero_grad(set_to_none=True)
        self.schedule.step()
        self.state.step = step + 1
        self.state.tokens += self.global_batch * self.cfg.seq_len
        marks.append(mark())
        self._enter("aggregation", step)
        aggregated = self.fedavg is not None and self.fedavg.after_step(step + 1)
        if aggregated:
            self.state.aggregations += 1
        marks.append(mark())
        self.log.add(step, marks, loss, aggregated, lr, self.state.tokens,
                     self.blocked.take() if self.blocked is not None else 0.0)
        return loss.detach()

    def _enter(self, phase: str, step: int) -> None:
        if self.watchdog is not None:
            self.watchdog.enter(phase, step)

    def _compiling(self) -> None:
        """torch.compile starts compiling: the energy meter pauses with the training clock."""
        if self.meter is not None and not self._in_apart:
            self.meter.pause()

    def _compiled(self, seconds: float) -> None:
        """torch.compile compiled for `seconds` (train.measure.compile_time): timed apart from training."""
        self.apart["compile"] += seconds
        if not self._in_apart:
            self.log.start += seconds
            if self.meter is not None:
                self.meter.resume()

    def _energy_after_the_first_step(self) -> None:
        """tokens/J over the steps tokens/s counts: the meter drops the first step's joules once the device has
        done it (its end event, asked without waiting; on CPU it is done)."""
        if self.meter is None or self.cfg.steps < 2:
            return
        if self.device == "cuda":
            done = torch.cuda.Event()
            done.record()
            self.meter.restart_when(done.query)
        else:
            self.meter.restart_when(lambda: True)
        self.energy_skips_first = True

    @contextmanager
    def _timed_apart(self, what: str):
        """Time `what` (checkpoint or logging I/O, an evaluation) apart from training: the training clock,
        which gives train_time_s and each step's elapsed_s, is moved forward past it. On GPU the queued
        training work finishes first, so none of it is counted as checkpoint, logging or evaluation time."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        if self.meter is not None:
            self.meter.pause()
        started, self._in_apart = time.perf_counter(), True
        try:
            yield
        finally:
            self._in_apart = False
            if self.meter is not None:
                self.meter.resume()
            spent = time.perf_counter() - started
            self.apart[what] += spent
            self.log.start += spent

    def train(self) -> float:
        """All steps; returns the training time: wall time less checkpoints and logging (timed apart).
        Progress goes to rank 0's stdout every log_every steps."""
        stop = StopRequest(self.device, self.cfg.stop_check_every)
        try:
            with self.blocked if self.blocked is not None else nullcontext():
                return self._train(stop)
        finally:
            stop.restore()
            if self.compile_clock is not None:
                self.compile_clock.close()

    def _train(self, stop: StopRequest) -> float:
        dist.barrier()
        if self.state.started_at is None:  # rank 0's is the one result.json keeps; resumes keep the first
            self.state.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.log.start = time.perf_counter() - self.state.train_time_s  # a resumed run's clock goes on
        stop_asked = False  # agreed by every rank; acted on at the next step with no streamed exchange in flight
        i = self.start_step
        while i < self.cfg.steps:
            self.profiler.before(i)
            self.step(i)
            if i == 0:
                self.state.first_step_compile_s = self.apart["compile"]
                self._energy_after_the_first_step()
            self.profiler.after(i)
            done = self.state.step  # i + 1, or a live peer's step where a late group healed (train.federation.groups)
            if self.cfg.eval_every and done % self.cfg.eval_every == 0 and done < self.cfg.steps:
                trained = time.perf_counter() - self.log.start  # before the evaluation, which is timed apart
                with self._timed_apart("eval"):
                    self.log.add_eval(done, trained, self.evaluate(done)[0])
            report = done % self.cfg.log_every == 0 or done == self.cfg.steps
            # agreed only where the world talks anyway: a step that logs or checkpoints
            due = self.checkpointer.due(done, self.cfg.steps)
            talks = report or due  # an averaging step's only collective is its exchange (train.federation)
            stop_asked = stop_asked or (done < self.cfg.steps and talks and stop.agreed(done))
            # a checkpoint amid a streamed exchange would land it early, and the resume would not be exact
            stopping = stop_asked and done < self.cfg.steps and self.checkpointer.quiet(done)
            save = stopping or due
            if report or save:  # a checkpoint must find metrics.jsonl holding every step it covers
                with self._timed_apart("logging"):
                    if report and not save and done < self.cfg.steps:
                        self.guard.check(f"step {done + 1}")  # the world talks here anyway
                    self.log.flush()
                    if report and self.rank == 0:
                        r = self.log.rows[-1]
                        print(f"[{self.spec.run_id}] step {r['step']}/{self.cfg.steps} loss {r['loss']:.4f} "
                              f"ppl {r['ppl']:.2f} step {r['step_time'] * 1e3:.1f} ms", flush=True)
            if save:
                self._enter("checkpoint", i)
                self.state.train_time_s = time.perf_counter() - self.log.start
                with self._timed_apart("checkpoint"):
                    self.guard.check("this checkpoint")
                    if self.fedavg is not None:
                        self.fedavg.flush()  # only after the last step: others wait for one with nothing in flight
                    self.checkpointer.save(self.model, self.optimizer, self.state, self.fedavg)
                self.checkpoints += 1
            if self.fault is not None and self.fault.due(done):
                self.fault.strike(self.run_dir, self.rank)
            if stopping:
                if self.watchdog is not None:
                    self.watchdog.close()  # waiting for the requeue is not a hang
                stop.hand_over(done)
            i = done
        if self.seat is not None:
            self.fedavg.finish()  # every group ends on the same model: a late one heals to it
        if self.fedavg is not None and self.cfg.final_average and not self.fedavg.in_sync_after(self.cfg.steps):
            self.guard.check("the final FedAvg")
            self.fedavg.average()  # evaluate the federation's model, not one group's
            self.state.aggregations += 1
        if self.device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        return time.perf_counter() - self.log.start

    @torch.no_grad()
    def evaluate(self, steps_done: int) -> tuple[float, float]:
        """Perplexity on the held-out set, split over all ranks (every rank runs the same number of forwards).
        In a federated run every evaluation follows a FedAvg (eval_every is a multiple of A, and the final
        average precedes the last), so all groups hold the model being measured."""
        self._enter("eval", steps_done - 1)
        self.guard.check("this evaluation")
        eval_set = self.source.eval_set(self.cfg.seq_len)
        n = eval_set.shape[0]
        mine = eval_set[[(self.eval_rank + j * self.eval_world) % n for j in range(math.ceil(n / self.eval_world))]]
        self.model.eval()
        dist.barrier()
        start = time.perf_counter()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        with torch.no_grad():  # nothing kept for a backward; a compiled layer compiles this mode once
            for chunk in mine.split(self.cfg.eval_batch):
                ids = chunk.to(self.device)
                loss = self.model(input_ids=ids, labels=ids).loss if self.pipeline is None else self.pipeline.loss(ids)
                if loss is None:  # not the last pipeline stage: the last counts this batch
                    continue
                predicted = ids.shape[0] * (ids.shape[1] - 1)
                total += torch.stack([loss.double() * predicted, torch.tensor(predicted, dtype=torch.float64,
                                                                            device=self.device)])
        dist.all_reduce(total)
        elapsed = time.perf_counter() - start
        self.model.train()
        return math.exp(min(700.0, (total[0] / total[1]).item())), elapsed

    def run(self, backend: str) -> RunResult | None:
        """The whole run; rank 0 returns its result (only rank 0 holds every logged step: the others may hold
        none, after a resume from the last step), the other ranks None."""
        # which machine ran it, before this attempt loads it (the load average at start)
        machine = describe_machine(self._gpu_name()) if self.rank == 0 else None
        self.restore()
        gathered = [None] * self.world  # where each rank runs, and on which machine (its energy reader's)
        host = socket.gethostname()
        dist.all_gather_object(gathered, ({"rank": self.rank, "host": host,
                                           "node": os.environ.get("SLURMD_NODENAME", host),
                                           "topology_addr": os.environ.get("SLURM_TOPOLOGY_ADDR")},
                                          energy.machine_id(), energy.gpu_uuid(self.device)))
        ranks, machines, gpus = (list(column) for column in zip(*gathered))
        before = (self.state.tokens, self.state.train_time_s)  # this attempt's energy covers this attempt only
        energy_source = self._open_meter(ranks[self.rank]["node"], machines, gpus)
        train_time = self.train()
        joules = self.meter.stop() if self.meter is not None else None
        eval_ppl, eval_time = self.evaluate(self.cfg.steps)
        self.log.add_eval(self.cfg.steps, train_time, eval_ppl)
        profiled = self.profiler.write(Path(self.spec.out_dir), self.rank)  # every rank, or none (one window)
        sent, exchange_s = (self.fedavg.event_bytes, self.fedavg.exchange_s) if self.fedavg is not None else (0, 0.0)
        measured = metrics.across_ranks({  # after training: the run's one read of these
            **metrics.device_memory(self.device),
            "peak_memory_bytes": ("max", int(metrics.peak_memory_bytes(self.device))),
            "aggregation_bytes": ("max", int(sent)), "aggregation_exchange_s": ("max", float(exchange_s)),
            "skipped_steps": ("max", int(self.state.skipped_steps))}, self.device)
        readings = [None] * self.world
        dist.all_gather_object(readings, (joules, energy_source, self.energy_skips_first))
        if self.rank != 0:
            return None
        not_measured = exposed.why_not(self.device, self.layout.T)
        tokens, seconds = self.state.tokens - before[0], train_time - before[1]
        if any(skipped for _, _, skipped in readings):  # the steps tokens/s counts
            tokens, seconds = self._after_the_first_step(tokens, seconds)
        efficiency = {"exposed_comm_s": None if not_measured else self.log.mean_blocked_s(),
                      "exposed_comm_method": not_measured or exposed.METHOD[self.device],
                      **energy.summary([(j, s) for j, s, _ in readings], tokens, seconds, self.world)}
        profile = {"steps": self.profiler.recorded, "traces": [profiling.trace_name(r) for r in range(self.world)]} \
            if profiled else None
        clock = self.compile_clock
        compiled = {"compile_graphs": clock.graphs, "compile_recompiles": clock.recompiles} if clock else {}
        return self.summary(train_time, eval_ppl, eval_time, ranks, backend,
                            {**measured, "profile": profile, **efficiency, "machine": machine, **compiled,
                             "tf32": self.cfg.tf32 if self.device == "cuda" else None,
                             "alloc_conf": launch_env.alloc_conf(self.device)})

    def _gpu_name(self) -> str | None:
        """This rank's GPU and how many the machine has (None on CPU)."""
        if self.device != "cuda":
            return None
        return f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}"

    def _open_meter(self, node: str, machines: list[str], gpus: list[str | None]) -> str | None:
        """Start this machine's energy reader on its lowest rank (`machines`: every rank's machine id; `gpus`: every
        rank's GPU), over every GPU of its machine's ranks; returns what it reads (None: not a reader, this
        machine's counter is another rank's), or why it cannot."""
        if machines.index(machines[self.rank]) != self.rank:
            return None
        try:
            counter = energy.open_counter(self.device, energy.node_gpus(machines, gpus, self.rank))
        except energy.Unavailable as exc:
            return f"none: {node}: {exc}"
        self.meter = energy.EnergyMeter(counter.read)
        self.meter.start()
        return counter.source

    def _after_the_first_step(self, tokens: int, seconds: float) -> tuple[int, float]:
        """(tokens, seconds) less the first step (log.first_step: its communicator set-up; its compilation is already
        timed apart): what tokens/s and tokens/J count. Unchanged where the log holds no first step."""
        first = self.log.first_step()
        if first is None:
            return tokens, seconds
        return tokens - first["tokens"], seconds - (first["step_time"] - self.state.first_step_compile_s)

    def summary(self, train_time, eval_ppl, eval_time, ranks, backend, measured: dict) -> RunResult:
        spec, cfg = self.spec, self.cfg
        tokens = self.state.tokens  # the whole run, as train_time (an elastic resume changed the world)
        first = self.log.first_step()
        steady = self.log.steady_step(spec.layout.A)
        counted, seconds = self._after_the_first_step(tokens, train_time)
        tokens_per_s = counted / seconds
        n_params = self.params
        mfu = None
        if measured["exposed_comm_s"] is not None:
            measured["compute_only_s"] = self.log.mean_step_time() - measured["exposed_comm_s"]
        if spec.peak_flops:
            per_token = models.flops_per_token(self.config, n_params, cfg.seq_len)
            mfu = per_token * tokens_per_s / (self.world * spec.peak_flops)
        train_loss = self.log.final_loss(min(cfg.log_every, cfg.steps))
        history = [[e["step"], e["train_time_s"], e["eval_ppl"]] for e in self.log.evals]
        reached = target_crossing(history, cfg.target_ppl)
        L = spec.layout
        return RunResult(
            run_id=spec.run_id, config=spec.config, repeat=spec.repeat, rank_order=spec.rank_order,
            strategy=L.strategy, F=L.F, R=L.R, S=L.S, A=L.A,
            world_size=self.world, tp=L.T, pp=L.P, microbatches=spec.microbatches if L.P > 1 else None,
            steps=cfg.steps, seq_len=cfg.seq_len, batch_per_rank=cfg.batch_per_rank,
            tokens=tokens, train_time_s=train_time, tokens_per_s=tokens_per_s,
            tokens_per_s_per_device=tokens_per_s / self.world, train_ppl=math.exp(min(700.0, train_loss)),
            eval_ppl=eval_ppl, eval_time_s=eval_time, floor_ppl=self.source.floor_ppl,
            baseline_ppl=self.source.baseline_ppl, started_at=self.state.started_at, axes=dict(spec.axes),
            phases=self.log.phase_stats(), aggregation_event=self.log.aggregation_event_stats(),
            aggregations=self.state.aggregations, timing=cfg.timing, precision=cfg.precision,
            reduce_dtype=cfg.reduce_dtype, params=n_params,
            mfu=mfu, device=self.device, backend=backend,
            data={**self.source.describe(), **self.source.seen(tokens)},
            ranks=[RankRecord(**r) for r in ranks], resumed_from_step=self.start_step,
            layout_changes=self.state.layout_changes,
            fault=faults.record(self.run_dir, self.start_step, self.resumed_at, self.global_batch * cfg.seq_len),
            checkpoint_s=self.apart["checkpoint"], checkpoints=self.checkpoints, logging_s=self.apart["logging"],
            compile_s=self.apart["compile"], eval_history=history, eval_s=self.apart["eval"], target_ppl=cfg.target_ppl,
            time_to_target_s=reached[1] if reached else None, steps_to_target=reached[0] if reached else None,
            first_step_s=first["step_time"] if first else None, steady_step_s=steady[0] if steady else None,
            steady_steps=steady[1] if steady else None,
            groups=[{"group": self.seat.group, "start": self.seat.start, **self.fedavg.summary()}]
            if self.seat else None, **measured)


def run(spec: RunSpec, environ=os.environ) -> RunResult | None:
    """Train one spec in this process (one rank). Rank 0 writes result.json last, atomically, and returns it."""
    config = models.llama_config(spec.model)
    source = data.for_run(spec, config.vocab_size)
    env = launch_env.detect(environ)
    seat = env.seat
    launch_env.expandable_segments(environ)  # before the first CUDA allocation
    if seat is not None:  # a federation group is its own world, its files in its own folder of the run's
        if env.world_size != spec.layout.group_world:
            raise SpecError(f"federation group {seat.group} of {spec.layout.name} has {spec.layout.group_world} "
                            f"rank(s) but its world has {env.world_size} ({env.launcher})")
    elif env.world_size != spec.world_size:
        names, sizes = ("F*R*S", spec.layout.shape[:3]) if spec.world_size == spec.layout.dp_world else \
            ("F*R*S*pp*tp", spec.layout.shape)
        raise SpecError(f"{names} = {'*'.join(map(str, sizes))} = {spec.world_size} but the launcher started "
                        f"{env.world_size} rank(s) ({env.launcher})")
    out_dir = Path(spec.out_dir) if seat is None else Path(spec.out_dir) / f"group{seat.group}"
    device = launch_env.pick_device(spec.device)
    if device == "cpu":
        launch_env.limit_cpu_threads(env)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"out_dir {out_dir} cannot be created: {exc.strerror}") from None
    if env.rank == 0:  # a stale result must not make this attempt look finished
        (Path(spec.out_dir) / "result.json").unlink(missing_ok=True)
        (out_dir / "result.json").unlink(missing_ok=True)
        # a restarted group keeps its earlier life's steps (train.federation.groups)
        root = out_dir / "checkpoints" if seat else None
        if checkpoint.Checkpointer(spec, env.rank, root).latest() is None and (seat is None or not seat.start):
            (out_dir / "metrics.jsonl").unlink(missing_ok=True)
            (out_dir / "evals.jsonl").unlink(missing_ok=True)
    backend = launch_env.init(env, device, spec.backend, out_dir, spec.train.timeout_s)
    try:
        trainer = Trainer(spec, env.rank, device, config, source, out_dir, launched=env)
        launch_env.apply_timeout(spec.train.timeout_s)
        result = trainer.run(backend)
        trainer.watchdog.close()
        if seat is not None:
            trainer.fedavg.close()
    except BaseException:  # including submitit's exit after a requeue
        launch_env.forget_rendezvous(env, out_dir)
        dist.destroy_process_group()
        raise
    launch_env.shutdown(env, out_dir)
    if result is None:
        return None
    result.save(out_dir / "result.json")
    return result
