"""The results store: manifest.jsonl maps run_id -> job id -> state, rewritten atomically on every change.

A run is finished when the manifest says COMPLETED and its result.json exists;
re-running a sweep skips finished runs and resubmits the rest.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from launcher.errors import StateError
from train.spec import write_atomic

FINAL = ("COMPLETED", "FAILED", "CANCELLED")


class Store:
    def __init__(self, sweep_dir: Path):
        self.sweep_dir = sweep_dir
        self.path = sweep_dir / "manifest.jsonl"
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                try:
                    entry = json.loads(line)
                    self.entries[entry["run_id"]] = entry
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise StateError(f"{self.path}:{n} is not a manifest entry: {line[:80]!r}") from None

    def record(self, run_id: str, **fields) -> dict:
        entry = self.entries.setdefault(run_id, {"run_id": run_id, "attempts": 0})
        entry.update(fields, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
        write_atomic(self.path, "".join(json.dumps(e) + "\n" for e in self.entries.values()))
        return entry

    def state(self, run_id: str) -> str | None:
        return self.entries.get(run_id, {}).get("state")

    def finished(self, run_id: str) -> bool:
        return self.state(run_id) == "COMPLETED" and (self.sweep_dir / run_id / "result.json").exists()
