"""One launcher per sweep directory: two writing the same manifest would resubmit each other's runs."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from launcher.errors import StateError


class SweepLock:
    """An exclusive flock on <sweep_dir>/.lock, released when the process ends (even if killed)."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / ".lock"

    def __enter__(self) -> "SweepLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            self.fh.close()
            raise StateError(f"another launcher ({holder}) is running on {self.path.parent}; "
                              f"wait for it or stop it first") from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}")
        self.fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()
