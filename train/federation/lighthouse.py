"""The Lighthouse a fault-tolerant run's federation groups form their quorums through (train.fault_tolerance=groups,
train.federation.groups): torchft's, in a process of its own, started before the groups and ended after them. On
cluster=local the job's supervisor (train.job.forked_ranks) starts it, on loopback; on SLURM the launcher does, on
the submitting host (launcher.groups), where it already waits for the run: no node's loss can take the Lighthouse
with it, and no job of its own has to wait in the queue before the groups can meet. Its own process because
torchft's server runs threads, and the local supervisor forks a lost group's ranks again later: a process that runs
threads must not fork. It ends with the process that started it.

Torch-free to import: the launcher reads `Federation.of(spec)` when it submits."""
from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from train.contract.common import FedshardError, write_atomic
from train.contract.config import HEARTBEAT_MS  # a group silent this long is dead: the others stop waiting for it

READY_S = 60.0  # for the Lighthouse process to import torchft and listen
PR_SET_PDEATHSIG = 1
READY = ".ready-group{}"  # in the run directory: a fresh group is ready to join the first quorum


def wait_for_groups(run_dir: Path, group: int, F: int, timeout_s: float) -> None:
    """Say this group is ready, then wait until all F are (a fresh run's first quorum gathers every group)."""
    write_atomic(run_dir / READY.format(group), "")
    deadline = time.monotonic() + timeout_s
    while not all((run_dir / READY.format(g)).exists() for g in range(F)):
        if time.monotonic() > deadline:
            missing = [g for g in range(F) if not (run_dir / READY.format(g)).exists()]
            raise FedshardError(f"federation group {group}: group(s) {missing} did not start within "
                                f"train.timeout_s={timeout_s:g} s")
        time.sleep(0.05)


def clear_ready(spec) -> None:
    """Forget which groups were ready: a failed attempt's marks would let the next attempt's first quorum form
    before every group has started (a late starter then heals: exact, but idle for up to A steps)."""
    for g in range(spec.layout.F):
        (Path(spec.out_dir) / READY.format(g)).unlink(missing_ok=True)


@dataclass(frozen=True)
class Federation:
    """What a fault-tolerant run's supervisor needs: how many groups, the quorum's floor and grace window."""

    F: int
    quorum_min: int
    grace_s: float

    @classmethod
    def of(cls, spec) -> "Federation | None":
        t = spec.train
        return cls(spec.layout.F, t.quorum_min, t.grace_s) if t.fault_tolerance == "groups" else None


LOOPBACK = "127.0.0.1"


class Lighthouse:
    """A running Lighthouse: its process, and the address the groups' torchft managers reach it at."""

    def __init__(self, federation: Federation, host: str = LOOPBACK, log: Path | None = None):
        """Start it and wait until it listens: on loopback only for `host` 127.0.0.1 (cluster=local), else on every
        interface of this host, advertised as `host` (the name the nodes know it by: cluster.lighthouse_host). Its
        log (a line per quorum) goes to `log`, else to this process's stderr (a local job's is its log already)."""
        stderr = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            stderr = open(log, "ab")  # noqa: SIM115 -- the child holds it; this process closes its copy below
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "train.federation.lighthouse",
                                          str(federation.quorum_min), str(int(federation.grace_s * 1000)),
                                          str(os.getpid()), host], stdout=subprocess.PIPE, stderr=stderr, text=True)
        finally:
            if stderr is not None:
                stderr.close()
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_S)
        self.address = self.proc.stdout.readline().strip() if ready else ""
        if not self.address.startswith("http://"):
            self.proc.kill()
            raise FedshardError(f"the torchft Lighthouse did not start within {READY_S:.0f} s (exit status "
                                f"{self.proc.poll()}): is torchft installed (pip install torchft==0.2.0)?")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(argv: list[str]) -> None:
    """`python -m train.federation.lighthouse QUORUM_MIN GRACE_MS PARENT_PID HOST`: print the address once listening,
    then serve until SIGTERM or the death of the process that started it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the server's threads inherit it
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(argv[2]):  # its parent died before prctl took effect
        return
    from torchft._torchft import LighthouseServer

    host = argv[3]
    server = LighthouseServer(bind=f"{LOOPBACK if host == LOOPBACK else '0.0.0.0'}:0", min_replicas=int(argv[0]),
                              join_timeout_ms=int(argv[1]), heartbeat_timeout_ms=HEARTBEAT_MS)
    port = server.address().rsplit(":", 1)[1]
    print(f"http://{host}:{port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
