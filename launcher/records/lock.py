"""One launcher per sweep directory: two writing the same manifest would resubmit each other's runs."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from train.contract.common import StateError


class SweepLock:
    """An exclusive flock on <sweep_dir>/.lock, released when the process ends (even if killed). The file is
    removed on a normal exit; a launcher that opened it just before compares inodes after locking, so it
    never holds a lock on a file that is no longer the sweep's."""

    def __init__(self, sweep_dir: Path):
        self.path = Path(sweep_dir) / ".lock"

    def __enter__(self) -> "SweepLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            self.fh = open(self.path, "a+")
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.fh.seek(0)
                holder = self.fh.read().strip() or "another process"
                self.fh.close()
                raise StateError(f"another launcher ({holder}) is running on {self.path.parent}; "
                                  f"wait for it or stop it first") from None
            if self._still_ours():
                break
            self.fh.close()  # the previous holder removed it as we opened it: lock the new file
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}")
        self.fh.flush()
        return self

    def _still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(self.fh.fileno()).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)  # still holding the lock: nobody else can be using this file
        self.fh.close()
