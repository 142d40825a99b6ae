"""Checkpoint when the scheduler says the job will be stopped, then requeue (submitit) or exit resumable.

SLURM sends submitit's signal (SIGUSR2 by default, `--signal=USR2@90`) to every task before a
preemption or the time limit, but the tasks receive it at different steps. The handler only
sets a flag; the ranks agree on it with one MAX all_reduce of one number, so all of them
checkpoint the same step. They agree only on a step whose ranks talk across the world anyway (it
logs or checkpoints), at least `stop_check_every` steps after the last agreement: a quiet step never
waits for another federation group, and an averaging step's only collective is its exchange. Keep
log_every steps well inside the signal's lead time. submitit's task 0 then hands the signal to
submitit's own handler, which calls TrainJob.checkpoint and requeues the job (it resumes from
this checkpoint); the other tasks wait for the requeue to end them (SLURM) or exit for the local
controller to restart. Without submitit the run ends with a one-line error saying where it stopped.
"""
from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist

from train.contract import submitit_compat
from train.contract.common import Stopped

REQUEUE_WAIT_S = 300.0  # on SLURM, tasks other than 0 wait this long for the requeue to end them


def stop_signal() -> int:
    return submitit_compat.preemption_signal()  # honours SUBMITIT_PREEMPT_SIGNAL, as submitit's handler does


class StopRequest:
    """Installed by the training loop on the main thread for the duration of training."""

    def __init__(self, device: str, every: int):
        self.every, self.received = every, False
        self.last = 0  # steps done at the last agreement
        self.signum = stop_signal()
        self.flag = torch.zeros(1, device=device)
        self.previous = signal.signal(self.signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = True

    def agreed(self, steps_done: int) -> bool:
        """Collective, on a step every rank calls it at (module docstring): True on every rank at once when any
        rank was signalled; False without asking within `every` steps of the last agreement."""
        if steps_done - self.last < self.every:
            return False
        self.last = steps_done
        self.flag.fill_(float(self.received))
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX)
        return bool(self.flag.item())

    def restore(self) -> None:
        signal.signal(self.signum, self.previous)

    def hand_over(self, steps_done: int) -> None:
        """After the checkpoint: let submitit requeue (its task 0), wait to be ended (others), or stop."""
        self.restore()
        executor = os.environ.get("SUBMITIT_EXECUTOR")
        if executor and callable(self.previous):  # submitit's checkpoint_and_try_requeue
            from submitit import JobEnvironment

            if JobEnvironment().global_rank == 0:  # submitit's task 0, which in-job placement may renumber
                self.previous(self.signum, None)  # requeues, then exits
            elif executor == "local":
                raise SystemExit(0)  # the local controller restarts every task when task 0 asks for a requeue
            else:
                time.sleep(REQUEUE_WAIT_S)  # SLURM ends this task when it requeues the job
        raise Stopped(f"stopped by {signal.Signals(self.signum).name} after step {steps_done}; a checkpoint of "
                      f"that step was saved: run the same command again to resume")
