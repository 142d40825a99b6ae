"""Step watchdog: a hung rank fails the run with rank, phase and step named, never a silent wait.

Each rank's watchdog thread writes a heartbeat (phase, step, time) about once a second, even while the main thread
is blocked in a collective, into a node-local directory (/dev/shm where there is one: memory, not the shared
filesystem that 512 ranks writing every second would load). When a phase outlasts `limit_s`, the thread looks at
every heartbeat it can see: a rank whose heartbeat went stale is stopped or dead (its threads no longer run) and is
named; otherwise the ranks furthest behind are. It then prints one line and ends the process, so the launcher sees
the failure at once.

Ranks on other nodes are seen only through a shared directory (train.heartbeat_dir): there one rank per node, the
lowest whose heartbeat is on the node, writes every NODE_TICK_S what the node's ranks last said.
"""
from __future__ import annotations

import hashlib
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from train.contract.common import write_atomic

TICK_S = 1.0  # a rank's node-local heartbeat
NODE_TICK_S = 10.0  # a node's heartbeat in the shared directory
STALE_TICKS = 3  # a heartbeat older than this many ticks (and 2 s) is a rank that no longer runs


def node_local_root() -> Path:
    """Memory-backed where the node has it, else the temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _stale(age: float, tick: float) -> bool:
    return age > STALE_TICKS * tick + 2


def _read(path: Path) -> list[tuple[int, int, str, float]]:
    """(rank, step, phase, time) lines of a heartbeat file; none if it is missing or being replaced."""
    try:
        lines = path.read_text().splitlines()
        return [(int(r), int(s), p, float(t)) for r, s, p, t in (line.split() for line in lines)]
    except (OSError, ValueError):
        return []


class Watchdog:
    def __init__(self, rank: int, world: int, run_dir: Path, tag: str, limit_s: float, shared_dir: str = ""):
        self.rank, self.world, self.limit_s = rank, world, limit_s
        run = hashlib.blake2b(str(Path(run_dir).resolve()).encode(), digest_size=6).hexdigest()
        self.dir = node_local_root() / f"fedshard-heartbeat-{run}-{tag}"
        self.shared = Path(shared_dir) / f"heartbeat-{run}-{tag}" if shared_dir else None
        for d in (self.dir, self.shared):
            if d is not None:
                d.mkdir(parents=True, exist_ok=True)
        self.node = socket.gethostname()
        self.phase, self.step, self.since = "start", 0, time.monotonic()
        self._stop = threading.Event()
        self._node_beat_at = 0.0
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="fedshard-watchdog", daemon=True)
        self._thread.start()

    def enter(self, phase: str, step: int) -> None:
        self.phase, self.step, self.since = phase, step, time.monotonic()

    def close(self) -> None:
        """Stop beating and take this rank's heartbeat (and its node's, if it wrote it) away."""
        self._stop.set()
        (self.dir / f"rank{self.rank}").unlink(missing_ok=True)
        if self.shared is not None and self._writes_node():
            (self.shared / f"node-{self.node}").unlink(missing_ok=True)
        for d in (self.dir, self.shared):
            try:
                if d is not None:
                    d.rmdir()  # the last rank out removes the directory
            except OSError:
                pass

    def _beat(self) -> None:
        write_atomic(self.dir / f"rank{self.rank}", f"{self.rank} {self.step} {self.phase} {time.time()}\n")
        if self.shared is not None and time.monotonic() - self._node_beat_at >= NODE_TICK_S and self._writes_node():
            self._node_beat_at = time.monotonic()
            lines = [line for f in sorted(self.dir.glob("rank*")) for line in _read(f)]
            write_atomic(self.shared / f"node-{self.node}", "".join(f"{r} {s} {p} {t}\n" for r, s, p, t in lines))

    def _writes_node(self) -> bool:
        """Whether this is the lowest rank with a heartbeat on this node."""
        ranks = [int(f.name[4:]) for f in self.dir.glob("rank*") if f.name[4:].isdigit()]
        return min(ranks, default=self.rank) >= self.rank

    def _watch(self) -> None:
        while not self._stop.wait(TICK_S):
            self._beat()
            waited = time.monotonic() - self.since
            if waited > self.limit_s:
                print(f"fedshard: error: rank {self.rank} waited {waited:.0f} s in phase {self.phase} at step "
                      f"{self.step + 1}: {self.suspects()}", file=sys.stderr, flush=True)
                os._exit(3)

    def seen(self) -> dict[int, tuple[int, str, float, float]]:
        """Every rank this rank can see: (step, phase, seconds since its heartbeat, the tick it beats at)."""
        now, out = time.time(), {}
        if self.shared is not None:
            for f in self.shared.glob("node-*"):
                for r, s, p, t in _read(f):
                    out[r] = (s, p, now - t, NODE_TICK_S)
        for f in self.dir.glob("rank*"):
            for r, s, p, t in _read(f):
                out[r] = (s, p, now - t, TICK_S)
        return out

    def suspects(self) -> str:
        seen = self.seen()
        stale = [r for r, v in sorted(seen.items()) if _stale(v[2], v[3])]
        if stale:
            return "; ".join(f"rank {r} is not responding (last seen in phase {seen[r][1]} at step {seen[r][0] + 1}, "
                             f"{seen[r][2]:.0f} s ago)" for r in stale)
        unseen = [r for r in range(self.world) if r not in seen]
        if unseen and self.shared is not None:
            return f"ranks {unseen[:8]}{' ...' if len(unseen) > 8 else ''} are not responding (no heartbeat)"
        where = "every rank is alive" if not unseen else (
            f"the {len(seen)} rank(s) seen are alive; ranks on other nodes are not visible from this one (set "
            f"train.heartbeat_dir to a shared directory to see them)")
        behind = min(v[0] for v in seen.values())
        laggards = [r for r, v in sorted(seen.items()) if v[0] == behind]
        return f"{where}; furthest behind: ranks {laggards} at step {behind + 1}"
