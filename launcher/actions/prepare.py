"""action=prepare: tokenize a corpus once (train.data.prepare) as one CPU job on the cluster, where the shared
filesystem and the CPUs are, rather than on a login node:

    python -m launcher action=prepare cluster=NAME data=tokens data.path=OUT data.tokenizer=DIR 'prepare.sources=[DIR]'

Everything the job would refuse (no data=tokens, missing sources or tokenizer, an OUT prepared with another
tokenizer) is refused here first, in one line. The job is one task with prepare.workers CPUs and no GPU; its
progress line is relayed every progress_s, and a cancelled or killed preparation resumes by running the same
command again (train.data.prepare keeps finished shards). Data runs then take the same data= settings.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from launcher import scheduler as schedulers
from launcher.actions.outcome import failure_reason
from launcher.records.lock import SweepLock
from launcher.settings import Settings, check_name
from launcher.submit import task_lines
from train.contract import submitit_compat
from train.contract.common import ConfigError
from train.contract.sections import TextData
from train.job.prepare import prepare_job as job_for


def prepare_job(settings: Settings):
    """The job's callable, after every check the job would make that can be made here."""
    data, request = settings.data, settings.prepare
    if data.kind != "tokens":
        raise ConfigError(f"action=prepare writes a data=tokens directory, but data.kind is {data.kind!r}: "
                          f"add data=tokens (or data=mc4_it) and data.path=OUT")
    if not isinstance(data.tokenizer, str) or not data.tokenizer:
        raise ConfigError("action=prepare needs data.tokenizer=DIR: the local tokenizer to prepare with "
                          "(runs of this directory are then checked against it)")
    if not request.sources:
        raise ConfigError("action=prepare needs prepare.sources=[PATH,...]: the .txt / .jsonl / .parquet files or "
                          "directories to tokenize")
    TextData(paths=list(request.sources), tokenizer=data.tokenizer, text_key=request.text_key).files()
    out = Path(data.path).resolve()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"data.path={out} is a file, not a directory")
    sources = tuple(str(Path(p).resolve()) for p in request.sources)
    return job_for(sources, data.tokenizer, out, request.workers, request.text_key,
                               request.eval_fraction)


def executor(settings: Settings, scheduler: schedulers.Scheduler, folder: Path):
    """One task, prepare.workers CPUs, no GPU."""
    request = settings.prepare
    return scheduler.cpu_executor(folder, f"prepare-{folder.parent.name}", request.workers,
                                  request.time_min or settings.cluster.time_min, request.partition)


def last_progress(job) -> str | None:
    """The job's latest progress line (train.data.prepare.Progress writes one every few seconds to its stderr)."""
    return (task_lines(job, "prepare: ", "stderr") or [None])[-1]


def prepare(settings: Settings) -> int:
    job = prepare_job(settings)
    cluster, scheduler = settings.cluster, schedulers.of(settings.cluster)
    if scheduler.runs_here:  # on this machine, at most its cores
        job = dataclasses.replace(job, workers=min(job.workers, os.cpu_count() or 1))
    scheduler.check_environment()
    scheduler.quiet()
    work = check_name(Path(job.out).name, check_name(cluster.name, settings.results_dir, "cluster.name") / "prepare",
                      "data.path's last part")
    with SweepLock(work):
        folder = work / "submitit"
        submitted = scheduler.submit_job(executor(settings, scheduler, folder), job, f"prepare {job.out}", folder)
        print(f"submitted the preparation of {job.out} as job {submitted.job_id} ({job.workers} worker(s))",
              flush=True)
        last = [time.monotonic()]

        def relay(state: str) -> None:  # its progress line every progress_s, else its state
            if time.monotonic() - last[0] > settings.progress_s:
                last[0] = time.monotonic()
                print(last_progress(submitted) or f"prepare: job {submitted.job_id} {state}", flush=True)

        try:
            state = scheduler.wait_for(submitted, 1, settings.poll_s, relay)
        except KeyboardInterrupt:
            submitted.cancel(check=False)
            print(f"fedshard: interrupted; job {submitted.job_id} cancelled. Run the same command again to go on: "
                  f"finished shards are kept", file=sys.stderr)
            return 130
    outcome = submitit_compat.task_outcome(submitted.paths.folder, submitted.job_id, 0)
    if outcome is not None and outcome[0] == "success":
        print(outcome[1])
        return 0
    ended = "" if state in ("FINISHED", "COMPLETED") else f" ({state})"  # a local job's state says only that
    print(f"fedshard: error: preparation job {submitted.job_id} failed{ended}: {failure_reason(submitted, 1)}; "
          f"logs in {folder}", file=sys.stderr)
    return 1

