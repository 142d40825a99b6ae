"""A local job's ranks forked from one interpreter: the job's single submitit task imports torch, transformers and
the trainer once, then forks one process per rank, instead of the local controller starting one fresh interpreter
per rank (each spends 5-7 s importing on 2 cores, all at once).

A rank is what a submitit task would have been: its own SUBMITIT_LOCAL_GLOBALID, its stdout and stderr in the task
log files submitit would have given it (rank 0 keeps the task's own), its exit status. The task forwards the
controller's signals to every rank (the pre-emption signal, Ctrl-C, SIGTERM), and ranks die with it (SIGKILL on
the parent's death, as a killed srun step takes its tasks). Once one rank fails the others get SIGTERM and,
GRACE_S later, SIGKILL, as torchrun does; the task then fails with one line naming the rank and its last error
line (so the launcher can tell a deterministic failure from one worth retrying). A rank that asks submitit for a
requeue (pre-emption) makes the task exit with submitit's requeue status, and the controller starts it again.

A fault-tolerant run (train.fault_tolerance=groups) is supervised by group instead: the task starts the torchft
Lighthouse (train.federation.lighthouse), then each federation group's ranks as a world of their own (their own
rendezvous port); when a rank fails, only its group's ranks are ended, and the group is started again while
another group still trains, to heal from it (train.federation.groups). Once every group has ended well, the job
merges their results (`job.merge_groups`).
"""
from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path

from train.contract import submitit_compat
from train.contract.common import FedshardError, atomic, free_port
from train.contract.config import GROUP_RESTARTS, not_restarted
from train.federation.lighthouse import Federation, Lighthouse

GRACE_S = 3.0  # between SIGTERM and SIGKILL for the ranks left once one failed (torchrun gives 30 s)
POLL_S = 0.05
FORWARDED = (signal.SIGINT, signal.SIGTERM)  # and submitit's pre-emption signal
PR_SET_PDEATHSIG = 1


class RankError(FedshardError):
    """A rank of a local job failed: its number, how it ended, and the last error line it wrote."""


class ForkedRanks:
    """Picklable for submitit's LocalExecutor (one task): `job()` on `ranks` processes forked after importing
    `preload`; returns rank 0's value."""

    def __init__(self, job, ranks: int, preload: tuple[str, ...], federation: Federation | None = None):
        self.job, self.ranks, self.preload = job, ranks, tuple(preload)
        self.federation = federation  # fault-tolerant groups: supervised one group at a time

    def checkpoint(self, *args, **kwargs):
        """submitit's requeue on pre-emption: this same job again (its ranks resume from their checkpoint)."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)

    def __call__(self):
        for module in self.preload:
            importlib.import_module(module)
        from submitit import JobEnvironment

        environment = JobEnvironment()
        folder, job_id = environment.paths.folder, str(environment.job_id)
        ranks: dict[int, int] = {}  # pid -> rank
        handlers = _forward_signals_to(ranks)
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        if self.federation is not None:
            try:
                return self._supervise_groups(ranks, handlers, parent, folder, job_id)
            finally:
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
        for rank in range(self.ranks):
            pid = os.fork()
            if pid == 0:
                _be_rank(rank, self, handlers, parent, folder, job_id, {})  # never returns
            ranks[pid] = rank
        codes = _wait(ranks)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if submitit_compat.LOCAL_REQUEUE_STATUS in codes.values():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(submitit_compat.LOCAL_REQUEUE_STATUS)  # the controller starts this task again
        failed = [rank for rank, code in codes.items() if code != 0]  # in the order they ended
        if failed:
            rank = failed[0]
            raise RankError(f"rank {rank} of {self.ranks} {_ended(codes[rank])}: "
                            f"{_last_error(folder, job_id, rank)}")
        value = pickle.loads(_value_path(folder, job_id, 0).read_bytes())
        for rank in range(self.ranks):
            _value_path(folder, job_id, rank).unlink(missing_ok=True)
        return value


    def _supervise_groups(self, ranks: dict[int, int], handlers: dict, parent: int, folder: Path, job_id: str):
        """Each federation group its own world, restarted when lost while another trains (module docstring)."""
        F = self.federation.F
        size = self.ranks // F
        server = Lighthouse(self.federation)
        starts, restarts = [0] * F, []
        ended: dict[int, dict[int, int]] = {g: {} for g in range(F)}  # group -> {rank: exit status}
        kill_at: dict[int, float] = {}  # group -> when its ranks left get SIGKILL

        def start(group: int) -> None:
            port = free_port()
            for local in range(size):
                rank = group * size + local
                pid = os.fork()
                if pid == 0:
                    _be_rank(rank, self, handlers, parent, folder, job_id, {
                        "RANK": str(local), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local),
                        "LOCAL_WORLD_SIZE": str(self.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "FEDSHARD_GROUP": str(group), "FEDSHARD_GROUP_START": str(starts[group]),
                        "FEDSHARD_LIGHTHOUSE": server.address})
                ranks[pid] = rank
            ended[group] = {}

        try:
            self.job.clear_groups()  # a failed attempt's marks must not let this one's first quorum start early
            for group in range(F):
                start(group)
            while any(len(ended[g]) < size or any(ended[g].values()) for g in range(F)):
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    for group, at in list(kill_at.items()):
                        if time.monotonic() > at:
                            _signal([p for p, r in ranks.items() if r // size == group], signal.SIGKILL)
                            kill_at[group] = float("inf")
                    time.sleep(POLL_S)
                    continue
                rank = ranks.pop(pid)
                group, code = rank // size, os.waitstatus_to_exitcode(status)
                ended[group][rank] = code
                if code and group not in kill_at:
                    kill_at[group] = time.monotonic() + GRACE_S
                    _signal([p for p, r in ranks.items() if r // size == group], signal.SIGTERM)
                if len(ended[group]) < size or not any(ended[group].values()):
                    continue
                kill_at.pop(group, None)
                first = next(r for r, c in ended[group].items() if c)
                why = f"rank {first} of {self.ranks} {_ended(ended[group][first])}: " \
                      f"{_last_error(folder, job_id, first)}"
                reason = not_restarted(starts[group], any(len(ended[g]) < size for g in range(F) if g != group))
                if reason:
                    _signal(list(ranks), signal.SIGKILL)
                    raise RankError(f"federation group {group} lost ({reason}): {why}")
                starts[group] += 1
                restarts.append({"group": group, "start": starts[group], "at": time.time(), "why": why})
                print(f"fedshard: federation group {group} lost ({why}); starting it again ({starts[group]} of "
                      f"{GROUP_RESTARTS}): it heals from a group still training", file=sys.stderr, flush=True)
                start(group)
        finally:
            _signal(list(ranks), signal.SIGKILL)
            server.stop()
        for rank in range(self.ranks):
            _value_path(folder, job_id, rank).unlink(missing_ok=True)
        return self.job.merge_groups(restarts)


def _value_path(folder: Path, job_id: str, rank: int) -> Path:
    return folder / f"{job_id}_{rank}_rank_value.pkl"


def _forward_signals_to(ranks: dict[int, int]) -> dict:
    """Install handlers passing the controller's signals on to the ranks; returns the ones they replace (a rank puts
    them back: submitit's pre-emption handler is what requeues)."""
    def forward(signum, frame):
        for pid in list(ranks):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signals = (*FORWARDED, submitit_compat.preemption_signal())
    return {sig: signal.signal(sig, forward) for sig in signals}


def _be_rank(rank: int, forked: ForkedRanks, handlers: dict, parent: int, folder: Path, job_id: str,
             environ: dict[str, str]) -> None:
    """The forked child: rank `rank` of the job, as submitit's task `rank` would run it, with `environ` added (a
    federation group's own world); ends the process."""
    code = 1
    try:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the task died before prctl took effect
            os._exit(1)
        if rank:
            paths = submitit_compat.task_paths(folder, job_id, rank)
            for fd, path in ((1, paths.stdout), (2, paths.stderr)):
                opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(opened, fd)
                os.close(opened)
        os.environ.update(SUBMITIT_LOCAL_GLOBALID=str(rank), SUBMITIT_LOCAL_LOCALID=str(rank),
                          SUBMITIT_LOCAL_NTASKS=str(forked.ranks), **environ)
        value = forked.job()
        with atomic(_value_path(folder, job_id, rank)) as tmp:
            tmp.write_bytes(pickle.dumps(value))
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 -- what an interpreter does with an uncaught exception
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # no finalization: see train.runtime.ending


def _wait(ranks: dict[int, int]) -> dict[int, int]:
    """Every rank's exit status ({rank: code} in the order they ended; negative: the signal that ended it). Once
    one fails, the others get SIGTERM, then SIGKILL GRACE_S later."""
    codes: dict[int, int] = {}
    kill_at = None
    while ranks:  # a rank leaves `ranks` when it ends (the signal forwarder reads the same dict)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            codes[ranks.pop(pid)] = code
            ranks_left = list(ranks)
            if code not in (0, submitit_compat.LOCAL_REQUEUE_STATUS) and kill_at is None:
                kill_at = time.monotonic() + GRACE_S
                _signal(ranks_left, signal.SIGTERM)
            continue
        if kill_at is not None and time.monotonic() > kill_at:
            _signal(list(ranks), signal.SIGKILL)
            kill_at = float("inf")
        time.sleep(POLL_S)
    return codes


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _ended(code: int) -> str:
    return f"was ended by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"


def _last_error(folder: Path, job_id: str, rank: int) -> str:
    """The rank's last line that names an error, else its last line."""
    try:
        text = submitit_compat.task_paths(folder, job_id, rank).stderr.read_text(errors="replace")
    except OSError:
        return "no stderr"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or ["no error line"])[-1][:300]
