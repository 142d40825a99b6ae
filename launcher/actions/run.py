"""action=run: submit every unfinished run, wait with progress, collect results, print the tables."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from launcher import progress, shrink
from launcher import scheduler as schedulers
from launcher.actions.groups import GroupJobs
from launcher.actions.outcome import MAX_PREEMPTIONS, NODE_FAILURE, OneJob, preflight_named, retryable
from launcher.actions.plan import plan
from launcher.placement import health
from launcher.planning import place_one, usable_nodes
from launcher.prediction import probe_file
from launcher.records.lock import SweepLock, cancel_requested, clear_cancel
from launcher.records.record import record
from launcher.records.registry import FILE, Registry
from launcher.records.store import FINAL, Store
from launcher.records.target import REFERENCE, ReferenceTarget, resolution_note
from launcher.report import wandb_log
from launcher.report.write import outputs, write_report
from launcher.settings import Settings
from launcher.submit import attempt_folder
from launcher.sweep import PlannedRun, Run, expand
from train.contract.machine import host_digest
from train.contract.result import RunResult


class Sweeper:
    def __init__(self, settings: Settings, registry: Registry | None = None):
        self.settings, self.cluster = settings, settings.cluster
        self.registry = registry  # each run's prediction is registered before its first submission
        self.store = Store(settings.sweep_dir)
        self.running: dict[str, tuple[Run, OneJob | GroupJobs]] = {}
        self.failed: dict[str, str] = {}
        self.lost: dict[str, list[str]] = {}  # run -> nodes of its last attempt now down or drained
        self.settled = 0  # runs that reached a final state in this invocation
        self.scheduler = schedulers.of(self.cluster)
        self.started = time.monotonic()
        self.total = 0          # runs of the sweep, for the progress line
        self.queued: list[Run] = []  # runs waiting for their turn (sequential execution)
        self.live: dict[str, wandb_log.LiveRun] = {}  # W&B runs fed while their jobs train
        self.submitted_at: dict[str, float] = {}  # run -> when this invocation submitted it (monotonic)
        self.overheads: list[float] = []  # finished runs' wall time outside training: start-up, evaluation, teardown
        self.ids: set[str] = set()  # the sweep's runs (run_sweep), which the progress line counts
        self.planned: dict[str, PlannedRun] = {}  # what each run was last submitted as (a preempted one goes again)
        self.preempted: dict[str, int] = {}  # run -> times SLURM preempted it in this invocation
        self.cancelled = False  # action=cancel asked this sweep to stop (launcher.records.lock): nothing more goes

    def launch(self, planned: PlannedRun) -> None:
        run = planned.run
        attempt = self.store.entries.get(run.run_id, {}).get("attempts", 0) + 1
        run_dir = self.settings.sweep_dir / run.run_id
        spec_path, folder = run_dir / "spec.json", attempt_folder(run_dir, attempt)
        new_dir = not run_dir.exists()
        run.spec.save(spec_path)
        (run_dir / health.FILE).unlink(missing_ok=True)  # what an earlier attempt's preflight named is acted on
        registered = self.registry is not None and self.registry.register(run.run_id)
        try:
            if run.spec.train.fault_tolerance == "groups" and not self.scheduler.runs_here:
                job = GroupJobs(self.scheduler, planned, spec_path, folder)  # a SLURM job per federation group
            else:
                submitted = self.scheduler.submit(planned, spec_path, folder, self.settings.sweep_dir / "topology.json",
                                                  self._preflight())
                job = OneJob(self.scheduler, submitted, run.spec.world_size)
        except BaseException:  # nothing stays registered or written for a run that was never submitted
            shutil.rmtree(run_dir if new_dir else folder, ignore_errors=True)
            if registered and not new_dir:
                (run_dir / FILE).unlink(missing_ok=True)
            raise
        # a new attempt: the last one's failure (reason, scheduler_state) no longer describes the run
        self.store.record(run.run_id, job_id=str(job.job_id), state="SUBMITTED", attempts=attempt,
                          cluster=self.cluster.name, rank_order=self.cluster.rank_order, nodes=[], reason=None,
                          scheduler_state=None, submitted_from=host_digest())
        self.planned[run.run_id] = planned
        self.lost.pop(run.run_id, None)
        self.submitted_at[run.run_id] = time.monotonic()
        self._watch(run, job)
        print(f"submitted {run.run_id} as job {job.job_id} (attempt {attempt})", flush=True)

    def reattach(self, runs: list[Run]) -> None:
        """Watch the jobs an earlier launcher submitted but did not see end (it was killed), rather than
        submit them again: a job still running keeps running; one that ended is settled by wait()."""
        for run in runs:
            entry = self.store.entries.get(run.run_id, {})
            if entry.get("state") in FINAL or not entry.get("job_id"):
                continue
            if "," in str(entry["job_id"]):  # fault-tolerant groups: their Lighthouse ended with that launcher
                self.scheduler.cancel({run.run_id: (run.spec.world_size, Path(), entry["job_id"])})
                print(f"cancelled {run.run_id}'s group jobs {entry['job_id']}, submitted by an earlier launcher whose "
                      f"Lighthouse they met at: it goes again, from the step all its groups checkpointed", flush=True)
                continue
            folder = attempt_folder(self.settings.sweep_dir / run.run_id, entry["attempts"])
            job = self.scheduler.reattach(run.spec.world_size, folder, entry["job_id"])
            self._watch(run, OneJob(self.scheduler, job, run.spec.world_size))
            print(f"reattached {run.run_id} to job {entry['job_id']} (attempt {entry['attempts']}), "
                  f"submitted by an earlier launcher", flush=True)

    @property
    def sequential(self) -> bool:
        return self.scheduler.sequential

    def _watch(self, run: Run, job) -> None:
        self.running[run.run_id] = (run, job)
        if run in self.queued:
            self.queued.remove(run)
        live = wandb_log.open_run(self.settings.wandb, self.settings.sweep.name,
                                  self.settings.sweep_dir / run.run_id, run.spec)
        if live is not None:
            self.live[run.run_id] = live

    def _progress(self) -> str:
        running = [progress.Running(run_id, *progress.last_step(self.settings.sweep_dir / run_id),
                                    run.spec.train.steps) for run_id, (run, _) in self.running.items()]
        done = sum(self.store.finished(r) for r in (self.ids or self.store.entries))  # not a run failed or cancelled
        overhead = sum(self.overheads) / len(self.overheads) if self.overheads else None
        return progress.line(time.monotonic() - self.started, done, self.total, running,
                             [r.spec.train.steps for r in self.queued], self.sequential, overhead)

    def _settle_live(self, run_id: str, result: RunResult | None) -> None:
        live = self.live.pop(run_id, None)
        if live is not None:
            live.finish(result)

    def wait(self, total: int) -> None:
        last = time.monotonic()
        while self.running:
            # one call; a fault-tolerant run's group jobs are listed together (launcher.actions.groups)
            polled = self.scheduler.poll([i for _, job in self.running.values() for i in str(job.job_id).split(",")])
            for run_id, (run, job) in list(self.running.items()):
                done, state = job.state(polled)
                if not done:
                    if state != self.store.state(run_id):
                        self._changed(run_id, job, state)
                    continue
                del self.running[run_id]
                result_path = self.settings.sweep_dir / run_id / "result.json"
                if result_path.exists():
                    result = RunResult.load(result_path)
                    # fault-tolerant groups: each group's starts and losses, as result.json's groups has them
                    losses = {"groups": [{k: g[k] for k in ("group", "starts", "losses", "late_heals")}
                                         for g in result.groups]} if result.groups else {}
                    self.store.record(run_id, state="COMPLETED", **losses)
                    self.failed.pop(run_id, None)
                    if run_id in self.submitted_at and not result.resumed_from_step:
                        self.overheads.append(time.monotonic() - self.submitted_at[run_id] - result.train_time_s)
                    self._settle_live(run_id, result)
                elif self._stopping():
                    self.store.record(run_id, state="CANCELLED", reason="cancelled by action=cancel",
                                      scheduler_state=state)
                    self.failed.pop(run_id, None)
                    self._settle_live(run_id, None)
                elif state == "PREEMPTED" and self.preempted.get(run_id, 0) < MAX_PREEMPTIONS:
                    self._preempted(run_id, job, state)
                    continue
                else:
                    reason = job.failure
                    if state == "NODE_FAIL":
                        reason = f"{NODE_FAILURE}: {reason}"
                    if self._lost(run_id):
                        reason = f"lost node(s) {', '.join(self.lost[run_id])}: {reason}"
                    self.store.record(run_id, state="FAILED", reason=reason, scheduler_state=state)
                    self.failed[run_id] = reason
                    self._settle_live(run_id, None)
                self.settled += 1
                print(f"[{self.settled}/{total}] {run_id}: {self.store.state(run_id)}"
                      + (f" ({self.failed[run_id]})" if run_id in self.failed else ""), flush=True)
            for live in self.live.values():
                live.feed()
            if self.running and time.monotonic() - last > self.settings.progress_s:
                last = time.monotonic()
                print(self._progress(), flush=True)
            if self.running:
                time.sleep(self.scheduler.poll_interval(self.settings.poll_s))

    def _stopping(self) -> bool:
        """Whether action=cancel asked this sweep to stop (it stays stopped for the rest of this invocation)."""
        self.cancelled = self.cancelled or cancel_requested(self.settings.sweep_dir)
        return self.cancelled

    def _preempted(self, run_id: str, job, state: str) -> None:
        """SLURM preempted the job and did not requeue it: the same run goes again at once, as a new attempt that
        resumes from its last checkpoint; no retry is spent on it, and the manifest counts the preemptions."""
        job.cancel(check=False)  # had SLURM been about to requeue it after all, the resubmission stands alone
        self.preempted[run_id] = self.preempted.get(run_id, 0) + 1
        count = self.store.entries.get(run_id, {}).get("preemptions", 0) + 1
        self.store.record(run_id, state="PREEMPTED", scheduler_state=state, preemptions=count)
        print(f"{run_id}: job {job.job_id} was preempted (SLURM: PREEMPTED); resubmitting it to resume from its "
              f"last checkpoint (not a failure: no retry is spent)", flush=True)
        self.launch(self.planned[run_id])

    def _changed(self, run_id: str, job, state: str) -> None:
        """Record a job's new state, and where it runs. SLURM requeues a batch job whose node went down; it then
        waits for that node: with retry_shrink it is cancelled, to resume on the nodes left (_resubmission)."""
        fields = {"state": state, "job_id": str(job.job_id)}  # a fault-tolerant run's lost group has a new job
        nodes = job.nodes() if state == "RUNNING" else None
        if nodes is not None:
            fields["nodes"] = nodes
        self.store.record(run_id, **fields)
        if state != "PENDING" or not self._lost(run_id):
            return
        lost = ", ".join(self.lost[run_id])
        if not self.settings.retry_shrink:
            print(f"{run_id}: job {job.job_id} lost node(s) {lost} and waits in the queue for them (SLURM requeued "
                  f"it); retry_shrink=true would resume it on the nodes left", flush=True)
            return
        print(f"{run_id}: job {job.job_id} lost node(s) {lost}; cancelling it to resume on the nodes left",
              flush=True)
        job.cancel(check=False)

    def _lost(self, run_id: str) -> list[str]:
        """The nodes of this run's last allocation that SLURM now has down or drained (remembered in self.lost)."""
        nodes = self.store.entries.get(run_id, {}).get("nodes")
        if nodes:
            self.lost[run_id] = self.scheduler.lost_nodes(nodes)
        return self.lost.get(run_id, [])

    def _preflight(self) -> tuple[int, int, float] | None:
        """What a job's own preflight asks (cluster.preflight), None when it has none."""
        if not self.cluster.preflight:
            return None
        p = self.settings.preflight
        return p.bytes or (64 << 20 if self.cluster.device == "cuda" else 1 << 20), p.iters, p.fraction

    def _resubmission(self, planned: PlannedRun) -> PlannedRun | None:
        """What a retry submits: the same run, or, when its attempt lost nodes and retry_shrink is on, the run
        placed on the nodes left: the largest layout of its strategy that they hold (shrink.layout_on), recorded
        in the manifest. None (and one line) when they cannot hold it."""
        run = planned.run
        slow = preflight_named(self.settings.sweep_dir / run.run_id)  # its job's preflight: leave them out
        lost = self.lost[run.run_id] = sorted({*self.lost.get(run.run_id, []), *slow})
        if not lost or (not slow and not self.settings.retry_shrink):
            return planned
        if slow:
            print(f"{run.run_id}: its preflight named {', '.join(slow)}: placing it without them", flush=True)
        topo, _, real = self.scheduler.topology()
        usable = [n for n in usable_nodes(self.settings, topo, [run])[0] if n not in lost]
        G = self.cluster.gpus_per_node
        if len(usable) < run.nodes and not self.settings.retry_shrink:
            self.failed[run.run_id] = (f"{len(usable)} usable node(s) are left without {', '.join(lost)} and the run "
                                       f"needs {run.nodes}: retry_shrink=true would resume it on fewer")
            print(f"fedshard: {run.run_id}: {self.failed[run.run_id]}", flush=True)
            return None
        try:
            to = run if len(usable) >= run.nodes else \
                shrink.resized(run, shrink.layout_on(run.spec, len(usable), G), G, f"lost {', '.join(lost)}")
        except shrink.ShrinkError as e:
            print(f"fedshard: {e}", flush=True)
            self.failed[run.run_id] = str(e)
            return None
        if to is not run:
            entry = self.store.entries[run.run_id]
            change = shrink.change(run, to, entry["attempts"], lost)
            self.store.record(run.run_id, shrunk=[*entry.get("shrunk", []), change])
            a, b = run.spec.layout, to.spec.layout
            print(f"shrinking {run.run_id} after losing {', '.join(lost)}: (F,R,S)=({a.F},{a.R},{a.S}) on {run.nodes} "
                  f"nodes -> ({b.F},{b.R},{b.S}) on {to.nodes}, resuming from its last checkpoint", flush=True)
        return place_one(self.cluster, topo, real, usable, to)

    def cancel_running(self) -> None:
        for run_id, (_, job) in self.running.items():
            job.cancel(check=False)
            self.store.record(run_id, state="CANCELLED")
            self._settle_live(run_id, None)
        self.running.clear()

    def run(self, planned: list[PlannedRun], total: int | None = None) -> None:
        """Local (or `sequential`) runs go one at a time, as they share hardware; others are submitted together.
        `total`: the sweep's run count, where these runs are only its first part (sweep.target=reference)."""
        self.total = total or len(planned)
        self.planned.update({p.run.run_id: p for p in planned})
        todo = [p for p in planned if not self.store.finished(p.run.run_id)]
        for p in planned:
            if p not in todo:
                elsewhere = self.store.elsewhere(p.run.run_id)
                print(f"skipped {p.run.run_id}: finished earlier"
                      + (f" {elsewhere}: its numbers are reused, not measured here" if elsewhere else ""),
                      flush=True)
        if self._stopping():
            return
        self.reattach([p.run for p in todo])
        if self.running:
            self.wait(len(self.running))
            todo = [p for p in todo if not self.store.finished(p.run.run_id)]
        for attempt in range(1 + self.settings.retries):
            if self._stopping():
                break
            if attempt:
                failed = [p for p in todo if p.run.run_id in self.failed]
                for p in failed:
                    if not retryable(self.failed[p.run.run_id]):
                        print(f"not retrying {p.run.run_id}: it would fail the same way "
                              f"({self.failed[p.run.run_id]})", flush=True)
                todo = [p for p in map(self._resubmission, [p for p in failed if retryable(self.failed[p.run.run_id])])
                        if p is not None]
                if not todo:
                    break
                print(f"retrying {len(todo)} failed run(s)", flush=True)
            self.settled = 0
            if self.sequential:
                self.queued = [p.run for p in todo]
                for p in todo:
                    if self._stopping():  # a cancel stops the sweep: the runs still queued are not submitted
                        break
                    self.launch(p)
                    self.wait(len(todo))
            else:
                for p in todo:
                    if self._stopping():
                        break
                    self.launch(p)
                self.wait(len(todo))


def run_sweep(settings: Settings, runs: list[Run] | None = None, command: list[str] | None = None) -> int:
    """`runs`: the sweep's runs when given (a multirun's, over all its points), else expand(settings); `command`:
    the words typed, recorded in the sweep directory once its plan is written (launcher.records.record)."""
    scheduler = schedulers.of(settings.cluster)
    scheduler.quiet()  # submitit warns whenever sacct has no data (no accounting); Slurm.done copes without it
    runs = expand(settings) if runs is None else runs
    entries = Store(settings.sweep_dir).entries  # runs shrunk by an earlier invocation resume on their layout
    runs = [shrink.as_recorded(r, entries.get(r.run_id, {}), settings.cluster.gpus_per_node) for r in runs]
    target = ReferenceTarget(settings.sweep_dir, runs, settings.train) if settings.sweep.target else None
    note = resolution_note(settings)
    if note:
        print(note, flush=True)
    scheduler.check_environment()
    wandb_log.check(settings.wandb)
    Store(settings.sweep_dir).check_same_experiment([r.spec for r in runs], settings.cluster.name,
                                                        settings.cluster.rank_order)
    with SweepLock(settings.sweep_dir):
        clear_cancel(settings.sweep_dir)  # a request left by a cancel whose launcher had gone is not for this one
        planned, entries = plan(settings, runs, echo=False)
        if command is not None:
            record(settings.sweep_dir, command)
        sweeper = Sweeper(settings, Registry(settings.sweep_dir, entries, settings.cluster.rank_order,
                                             probe_file(settings)))
        sweeper.ids = {r.run_id for r in runs}
        try:
            if target is not None and target.declared is None:
                _run_reference_first(sweeper, planned, target)
            else:
                sweeper.run(planned)
        except KeyboardInterrupt:
            sweeper.cancel_running()
            raise
        finally:
            clear_cancel(settings.sweep_dir)
        results = finished(sweeper.store, settings.sweep_dir, runs)
        if results:
            markdown, written = write_report(settings.sweep_dir, results, settings.cluster, settings.sweep.scaling)
            print(markdown)
            print(outputs(settings.sweep_dir, written))
            elsewhere = [r.run_id for r in results if sweeper.store.elsewhere(r.run_id)]
            if elsewhere:
                print(f"note: {len(elsewhere)} of the {len(results)} run(s) in these tables finished on another "
                      f"machine or one not recorded ({', '.join(elsewhere[:3])}{', ...' if len(elsewhere) > 3 else ''}"
                      f"; the `skipped` lines above say which): they are not this machine's numbers; results_dir=DIR "
                      f"elsewhere measures them here")
        hint = wandb_log.sync_hint(settings.wandb, settings.sweep_dir)
        if hint:
            print(hint)
    if sweeper.failed:
        print(f"fedshard: {len(sweeper.failed)} of {len(runs)} run(s) failed: "
              + "; ".join(f"{k}: {v}" for k, v in sweeper.failed.items()))
    if sweeper.cancelled:
        cancelled = sum(sweeper.store.state(r.run_id) == "CANCELLED" for r in runs)
        left = sum(sweeper.store.state(r.run_id) not in FINAL for r in runs)
        print(f"fedshard: sweep {settings.sweep.name} stopped by action=cancel: {cancelled} run(s) cancelled, "
              f"{left} not run; the same command resumes it", flush=True)
    return 1 if sweeper.failed or sweeper.cancelled else 0


def finished(store: Store, sweep_dir, runs: list[Run]) -> list[RunResult]:
    return [RunResult.load(sweep_dir / r.run_id / "result.json") for r in runs if store.finished(r.run_id)]


def _run_reference_first(sweeper: Sweeper, planned: list[PlannedRun], target: ReferenceTarget) -> None:
    """The reference runs, then the target declared from them, then the other runs with it in their specs."""
    reference = {r.run_id for r in target.reference}
    sweeper.run([p for p in planned if p.run.run_id in reference], total=len(planned))
    results = finished(sweeper.store, sweeper.settings.sweep_dir, target.reference)
    if len(results) < len(reference):
        print(f"fedshard: no target declared: {len(reference) - len(results)} {REFERENCE} run(s) did not finish, "
              f"so the other {len(planned) - len(reference)} run(s) were not submitted", flush=True)
        return
    target.declare(results)
    sweeper.run([p for p in planned if p.run.run_id not in reference], total=len(planned))

