"""The results store: manifest.jsonl maps run_id -> job id -> state, rewritten atomically on every change.

A run is finished when the manifest says COMPLETED and its result.json exists;
re-running a sweep skips finished runs and resubmits the rest — but only runs of the same experiment:
a run directory whose spec.json differs in any key the result depends on (train.contract.spec.identity), or
whose runs went to another cluster, is never reused (`check_same_experiment`).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from train.contract.common import FedshardError, StateError, write_atomic
from train.contract.machine import host_digest, label
from train.contract.result import RunResult
from train.contract.spec import RunSpec, identity_changes

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
        for key in [key for key, value in fields.items() if value is None]:  # None removes a field
            del entry[key]
        write_atomic(self.path, "".join(json.dumps(e) + "\n" for e in self.entries.values()))
        return entry

    def state(self, run_id: str) -> str | None:
        return self.entries.get(run_id, {}).get("state")

    def finished(self, run_id: str) -> bool:
        return self.state(run_id) == "COMPLETED" and (self.sweep_dir / run_id / "result.json").exists()

    def elsewhere(self, run_id: str) -> str | None:
        """Where a finished run ran, in words, when not on or from this machine: None when this machine submitted
        it (the entry's submitted_from, which the launcher records) or ran it (its result.json's machine), else
        the machine its result.json names, or that it names none (a result from before machines were recorded,
        such as the committed ones). A run reused from elsewhere is labelled so, not refused: a sweep resumed from
        another login node of the same cluster is still the user's."""
        here = host_digest()
        if self.entries.get(run_id, {}).get("submitted_from") == here:
            return None
        try:
            machine = RunResult.load(self.sweep_dir / run_id / "result.json").machine
        except (OSError, FedshardError):
            machine = None
        if machine is None:
            return "on a machine not recorded (its result.json has no `machine`)"
        return None if machine.get("host") == here else f"on another machine ({label(machine)})"

    def check_same_experiment(self, specs: list, cluster: str, rank_order: str) -> None:
        """Refuse, before anything is submitted, run directories left by another experiment: reusing their
        results (or resuming their checkpoints) would report one experiment under another's name. Besides the
        spec, a run is of its cluster and of its rank order (rank_order: topology or slurm)."""
        clashes = []
        for spec in specs:
            run_dir = self.sweep_dir / spec.run_id
            legacy = self.sweep_dir / f"{spec.config}-rep1"  # before 2026-12-06 a first repeat could be named so
            if spec.repeat == 1 and legacy.is_dir() and not run_dir.exists():
                raise StateError(f"{legacy} holds repeat 1 of {spec.config} as an earlier fedshard named it; this one "
                                 f"names it {run_dir.name}: rename the directory (mv {legacy} {run_dir}) to resume "
                                 f"or reuse it, or use another results_dir")
            entry = self.entries.get(spec.run_id, {})
            changes = [f"{key}: {entry[key]!r} -> {now!r}" for key, now in (("cluster", cluster),
                       ("rank_order", rank_order)) if entry.get(key) not in (None, now)]
            if (run_dir / "spec.json").exists():
                try:  # read back as a spec, so that defaults filled in since compare equal
                    earlier = RunSpec.load(run_dir / "spec.json").to_dict()
                except FedshardError as exc:
                    raise StateError(f"{run_dir / 'spec.json'} cannot be read as a run spec ({exc}); delete "
                                     f"{run_dir} to rerun it") from None
                changes += identity_changes(earlier, spec.to_dict())
            if changes:
                clashes.append((run_dir, changes))
        if clashes:
            run_dir, changes = clashes[0]
            more = f"; {len(clashes) - 1} more run(s) differ too" if len(clashes) > 1 else ""
            raise StateError(f"{run_dir} holds a run of another experiment ({', '.join(changes[:4])}"
                             f"{', ...' if len(changes) > 4 else ''}){more}: use another results_dir, "
                             f"or delete {'these run directories' if more else 'it'} to run afresh")
