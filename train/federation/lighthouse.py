"""The Lighthouse a fault-tolerant run's federation groups form their quorums through (train.fault_tolerance=groups,
train.federation.groups): torchft's, in a process of its own that the local job's supervisor (train.job.forked_ranks)
starts before the groups and ends after them. Its own process because torchft's server runs threads, and the
supervisor forks a lost group's ranks again later: a process that runs threads must not fork. On the submitting
host, where the supervisor already runs: nothing else has to be reachable, and it lives exactly as long as the job.

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


def start(federation: Federation) -> tuple[subprocess.Popen, str]:
    """The Lighthouse's process, listening on loopback, and its address for the groups' torchft managers."""
    proc = subprocess.Popen([sys.executable, "-m", "train.federation.lighthouse", str(federation.quorum_min),
                             str(int(federation.grace_s * 1000)), str(os.getpid())], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], READY_S)
    line = proc.stdout.readline().strip() if ready else ""
    if not line.startswith("http://"):
        proc.kill()
        raise FedshardError(f"the torchft Lighthouse did not start within {READY_S:.0f} s "
                            f"(exit status {proc.poll()}): is torchft installed (pip install torchft==0.2.0)?")
    return proc, line


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str]) -> None:
    """`python -m train.federation.lighthouse QUORUM_MIN GRACE_MS PARENT_PID`: print the address once listening, then
    serve until SIGTERM or the supervisor's death."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the server's threads inherit it
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(argv[2]):  # the supervisor died before prctl took effect
        return
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=int(argv[0]), join_timeout_ms=int(argv[1]),
                              heartbeat_timeout_ms=HEARTBEAT_MS)
    port = server.address().rsplit(":", 1)[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
