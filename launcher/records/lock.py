"""One launcher per sweep directory: two writing the same manifest would resubmit each other's runs. Another
process talks to the launcher holding it through one file: action=cancel's request to stop the sweep."""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from train.contract.common import StateError, write_atomic


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


# action=cancel from another terminal tells the launcher holding the lock to stop its sweep: the jobs it cancels
# end without a result, and this file says why (a cancel, not a failure to retry), so the launcher records them
# CANCELLED and submits nothing more. The launcher removes it when it starts and when it ends.
CANCEL = "cancel.json"


def request_cancel(sweep_dir: Path, run_ids: list[str]) -> None:
    """Ask the sweep's launcher (if one holds the lock) to stop: no further submission, no retry."""
    write_atomic(Path(sweep_dir) / CANCEL, json.dumps({"runs": run_ids, "pid": os.getpid(),
                                                       "at": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def cancel_requested(sweep_dir: Path) -> bool:
    return (Path(sweep_dir) / CANCEL).exists()


def clear_cancel(sweep_dir: Path) -> None:
    (Path(sweep_dir) / CANCEL).unlink(missing_ok=True)
