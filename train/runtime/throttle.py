"""`python -m train.runtime.throttle PID SPEED`: let process PID run only SPEED of every PERIOD_S, stopping
(SIGSTOP) and continuing (SIGCONT) it as a CPU quota throttles a cgroup, until PID ends or this process is told
to stop (then PID is left running). The slow fault of train.runtime.fault: a node that computes and sends at a
fraction of its speed, on any machine, with no cgroup or root rights needed."""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PERIOD_S = 0.1
PR_SET_PDEATHSIG = 1


def throttle(pid: int, speed: float) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the rank ended: so do we
    try:
        while not stop:
            os.kill(pid, signal.SIGCONT)
            time.sleep(speed * PERIOD_S)
            if stop:
                break
            os.kill(pid, signal.SIGSTOP)
            time.sleep((1 - speed) * PERIOD_S)
    except ProcessLookupError:
        return
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    throttle(int(sys.argv[1]), float(sys.argv[2]))
