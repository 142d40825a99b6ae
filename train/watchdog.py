"""Step watchdog: a hung rank fails the run with rank, phase and step named, never a silent wait.

Each rank's watchdog thread writes a heartbeat file (phase, step, time) about once a second,
even while the main thread is blocked in a collective. When a phase outlasts `limit_s`, the
thread looks at every rank's heartbeat: a rank whose heartbeat went stale is stopped or dead
(its threads no longer run) and is named; otherwise the ranks furthest behind are. It then
prints one line and ends the process, so the launcher sees the failure at once.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from .spec import write_atomic

TICK_S = 1.0


class Watchdog:
    def __init__(self, rank: int, world: int, run_dir: Path, tag: str, limit_s: float):
        self.rank, self.world, self.limit_s = rank, world, limit_s
        self.dir = Path(run_dir) / f".heartbeat-{tag}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.phase, self.step, self.since = "start", 0, time.monotonic()
        self._stop = threading.Event()
        self._beat()
        threading.Thread(target=self._watch, name="fedshard-watchdog", daemon=True).start()

    def enter(self, phase: str, step: int) -> None:
        self.phase, self.step, self.since = phase, step, time.monotonic()

    def close(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        write_atomic(self.dir / f"rank{self.rank}", f"{self.step} {self.phase} {time.time()}\n")

    def _watch(self) -> None:
        while not self._stop.wait(TICK_S):
            self._beat()
            waited = time.monotonic() - self.since
            if waited > self.limit_s:
                print(f"fedshard: error: rank {self.rank} waited {waited:.0f} s in phase {self.phase} at step "
                      f"{self.step + 1}: {self.suspects()}", file=sys.stderr, flush=True)
                os._exit(3)

    def suspects(self) -> str:
        now, seen = time.time(), {}
        for r in range(self.world):
            try:
                step, phase, at = (self.dir / f"rank{r}").read_text().split()
                seen[r] = (int(step), phase, now - float(at))
            except (OSError, ValueError):
                seen[r] = None
        stale = [r for r, v in seen.items() if v is None or v[2] > 3 * TICK_S + 2]
        if stale:
            return "; ".join(f"rank {r} is not responding" + ("" if seen[r] is None else
                             f" (last seen in phase {seen[r][1]} at step {seen[r][0] + 1}, {seen[r][2]:.0f} s ago)")
                             for r in stale)
        behind = min(v[0] for v in seen.values())
        laggards = [r for r, v in seen.items() if v[0] == behind]
        return f"every rank is alive; furthest behind: ranks {laggards} at step {behind + 1}"
