"""action=status, cancel and tail: a sweep looked at (or stopped) from another terminal while its launcher waits,
or after it was killed. They read the sweep's own record (plan.json, manifest.jsonl, each run's spec.json) and the
jobs' logs, not the command line (a multirun's runs are there without its -m), and ask the scheduler; they never
wait for the sweep's lock, so they work beside a running launcher, which records what its jobs do (a cancel asks it,
through the sweep directory, to stop and submit nothing more)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from launcher import scheduler as schedulers
from launcher.progress import last_step
from launcher.records.lock import SweepLock, request_cancel
from launcher.records.store import FINAL, Store
from launcher.settings import Settings
from launcher.submit import attempt_folder
from launcher.sweep import Run
from train.contract import submitit_compat
from train.contract.common import ConfigError, FedshardError, StateError
from train.contract.spec import RunSpec


@dataclass(frozen=True)
class Recorded:
    """A run as its sweep directory records it: its id, steps and ranks (None where nothing records them)."""
    run_id: str
    steps: int | None
    tasks: int | None


def recorded_runs(settings: Settings, runs: list[Run]) -> list[Recorded]:
    """The sweep's runs as its directory has them: plan.json's (what its last launcher planned), then any other
    run manifest.jsonl holds, each with its own spec.json's steps and ranks where it has one (a shrunk run's);
    the command line's runs only while the directory records none (a sweep not planned yet)."""
    sweep_dir = settings.sweep_dir
    given = {r.run_id: Recorded(r.run_id, r.spec.train.steps, r.spec.world_size) for r in runs}
    planned: dict[str, Recorded] = {}
    try:
        for e in json.loads((sweep_dir / "plan.json").read_text())["runs"]:
            planned[e["run_id"]] = Recorded(e["run_id"], e["train"]["steps"], e["world_size"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no plan yet (or not one this launcher wrote): the manifest, else the command line, names the runs
    ids = [*planned, *(r for r in Store(sweep_dir).entries if r not in planned)]
    if not ids:
        return list(given.values())
    out = []
    for run_id in ids:
        try:
            spec = RunSpec.load(sweep_dir / run_id / "spec.json")
            out.append(Recorded(run_id, spec.train.steps, spec.world_size))
        except (OSError, FedshardError):
            out.append(planned.get(run_id) or given.get(run_id) or Recorded(run_id, None, None))
    return out


def _log_paths(settings: Settings, run_id: str, entry: dict) -> list[Path]:
    """Task 0's stdout and stderr of the run's latest attempt (where its progress and its errors go): of federation
    group 0's current job in a fault-tolerant run on SLURM (its job ids joined by commas, launcher.actions.groups)."""
    if not entry.get("job_id"):
        return []
    folder = attempt_folder(settings.sweep_dir / run_id, entry.get("attempts", 1))
    job_id = str(entry["job_id"])
    if "," in job_id:
        folder, job_id = folder / "group0", job_id.split(",")[0]
    paths = submitit_compat.task_paths(folder, job_id, 0)
    return [paths.stdout, paths.stderr]


def _last_line(paths: list[Path]) -> str:
    """The last non-empty line the run's task 0 wrote, from whichever of its logs changed last."""
    existing = sorted((p for p in paths if p.exists()), key=lambda p: p.stat().st_mtime)
    for path in reversed(existing):
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1][:160]
    return ""


def live_states(settings: Settings, store: Store, runs: list[Recorded]) -> dict[str, str]:
    """The scheduler's word on every run the manifest has not settled: squeue/scontrol on SLURM (one call), the
    controller process of this machine's jobs."""
    return schedulers.of(settings.cluster).live(_jobs(settings, store, [
        r for r in runs if store.entries.get(r.run_id, {}).get("job_id") and store.state(r.run_id) not in FINAL]))


def _jobs(settings: Settings, store: Store, runs: list[Recorded]) -> dict[str, tuple[int, Path, str]]:
    """{run: (its ranks, its latest attempt's folder, its job id)} of runs the manifest gives a job."""
    out = {}
    for run in runs:
        entry = store.entries[run.run_id]
        out[run.run_id] = (run.tasks or 1, attempt_folder(settings.sweep_dir / run.run_id, entry["attempts"]),
                           str(entry["job_id"]))
    return out


def status(settings: Settings, runs: list[Run]) -> int:
    """One line per run of the sweep's record: state (the scheduler's, where the manifest has not settled it), job
    id, attempts, step, the last line of its log; then the counts."""
    store = Store(settings.sweep_dir)
    runs = recorded_runs(settings, runs)
    live = live_states(settings, store, runs)
    width = max(24, *(len(r.run_id) for r in runs))
    print(f"sweep {settings.sweep.name} on cluster {settings.cluster.name}: {settings.sweep_dir}")
    print(f"  {'run':<{width}} {'state':<12} {'job':>10} {'try':>3} {'step':>11}  last log line")
    counts: dict[str, int] = {}
    for run in runs:
        entry = store.entries.get(run.run_id, {})
        state = live.get(run.run_id) or store.state(run.run_id) or "NOT SUBMITTED"
        if state == "COMPLETED" and not store.finished(run.run_id):
            state = "NO RESULT"
        counts[state] = counts.get(state, 0) + 1
        step, _ = last_step(settings.sweep_dir / run.run_id)
        line = entry.get("reason") or _last_line(_log_paths(settings, run.run_id, entry))
        steps = f"{step}/{run.steps or '?'}"
        print(f"  {run.run_id:<{width}} {state:<12} {entry.get('job_id', '-'):>10} {entry.get('attempts', 0):>3} "
              f"{steps:>11}  {line}")
    print("  " + ", ".join(f"{n} {state.lower()}" for state, n in counts.items()))
    return 0


def cancel(settings: Settings, runs: list[Run]) -> int:
    """Stop the sweep: cancel every queued or running job of it (scancel on SLURM, the controller's SIGINT here)
    and record them CANCELLED. A launcher waiting on the sweep is asked first (launcher.records.lock) to record
    them itself and submit nothing more (neither the runs still to go nor a retry); without one, the manifest is
    settled here."""
    store = Store(settings.sweep_dir)
    if not settings.sweep_dir.is_dir():
        print(f"nothing to cancel: sweep {settings.sweep.name} has no directory ({settings.sweep_dir})")
        return 0
    runs = recorded_runs(settings, runs)
    live = {run_id: state for run_id, state in live_states(settings, store, runs).items() if state != "ENDED"}
    jobs = _jobs(settings, store, [r for r in runs if r.run_id in live])
    scheduler = schedulers.of(settings.cluster)
    try:
        with SweepLock(settings.sweep_dir):  # no launcher waits on them: the manifest is ours to settle
            if live:
                scheduler.cancel(jobs)
            for run_id in live:
                store.record(run_id, state="CANCELLED", reason="cancelled by action=cancel")
        waiting = False
    except StateError:  # a launcher holds the sweep: told first, it records the jobs' end and goes no further
        waiting = True
        request_cancel(settings.sweep_dir, list(live))
        if live:
            scheduler.cancel(jobs)
    for run_id, state in live.items():
        print(f"cancelled {run_id} (job {store.entries[run_id]['job_id']}, was {state})")
    if waiting:
        print(f"the launcher of sweep {settings.sweep.name} records them CANCELLED and submits nothing more")
    elif not live:
        print(f"nothing to cancel: no job of sweep {settings.sweep.name} is queued or running")
    return 0


def tail(settings: Settings, runs: list[Run], poll_s: float = 1.0) -> int:
    """Print the run's log (task 0's stdout and stderr, latest attempt) as it grows, until its job ends (Ctrl-C
    stops following; the job goes on)."""
    if not settings.run:
        raise ConfigError("action=tail needs run=RUN_ID (action=status lists the sweep's runs)")
    by_id = {r.run_id: r for r in recorded_runs(settings, runs)}
    if settings.run not in by_id:
        raise ConfigError(f"run={settings.run} is not a run of sweep {settings.sweep.name} "
                          f"({', '.join(list(by_id)[:6])}{', ...' if len(by_id) > 6 else ''})")
    offsets: dict[Path, int] = {}

    def follow(entry: dict) -> None:  # print what the logs gained since the last look
        for path in _log_paths(settings, settings.run, entry):
            if path.exists():
                with open(path, errors="replace") as fh:
                    fh.seek(offsets.get(path, 0))
                    text = fh.read()
                    offsets[path] = fh.tell()
                if text:
                    print(text, end="" if text.endswith("\n") else "\n", flush=True)

    asked = float("-inf")  # the scheduler is asked every settings.poll_s, the logs read every poll_s
    try:
        while True:
            store = Store(settings.sweep_dir)
            entry = store.entries.get(settings.run, {})
            if not entry.get("job_id"):
                raise ConfigError(f"{settings.run} has not been submitted (action=status shows the sweep)")
            follow(entry)
            ended = store.state(settings.run) in FINAL
            if not ended and time.monotonic() - asked >= settings.poll_s:
                asked = time.monotonic()
                ended = live_states(settings, store, [by_id[settings.run]]).get(settings.run, "ENDED") == "ENDED"
            if ended:
                follow(entry)  # what the job wrote between the last look and its end
                print(f"[{settings.run}: {store.state(settings.run) or 'ended'}]")
                return 0
            time.sleep(poll_s)
    except KeyboardInterrupt:
        print(f"[stopped following {settings.run}; its job goes on]")
        return 0
