"""Registered predictions: the step-time model's prediction for a run, stored in <run>/prediction.json before the
run is first submitted, with what it was made from (probe file hash, commit) and when. The report compares a
measurement only with this registered value: a prediction made after its run started could have been fitted to
it, so it is shown as post hoc and kept out of accuracy figures."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from train.contract.common import write_atomic
from train.contract.machine import commit

FILE = "prediction.json"
PREDICTED = ("predicted_step_s", "predicted_first_step_s", "predicted_step_bounds_s", "predicted_compute_s",
             "predicted_comm_by_group_s", "predicted_exposed_comm_s", "compute_source")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def before(registered_at: str | None, started_at: str | None) -> bool:
    """Whether a registration predates a run's start (both ISO 8601 with a zone; unknown is not before)."""
    if not registered_at or not started_at:
        return False
    return datetime.fromisoformat(registered_at) <= datetime.fromisoformat(started_at)


def file_sha256(path: Path | None) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None


def model_name(model: dict) -> str:
    """The model as tables name it: its preset, else its width x depth."""
    return model.get("preset") or f"{model.get('hidden_size')}x{model.get('num_hidden_layers')}"


class Registry:
    """The plan's predictions of one sweep, registered run by run as they are submitted."""

    def __init__(self, sweep_dir: Path, entries: list, rank_order: str, probe: Path | None):
        """`probe`: the probe.json the plan priced with (launcher.prediction.probe_file); None: nominal bandwidth
        and peak_flops, as compute_source says."""
        self.sweep_dir, self.rank_order = sweep_dir, rank_order
        self.entries = {e.run_id: e for e in entries}
        self.probe, self.probe_sha256 = (str(probe) if probe else None), file_sha256(probe)

    def register(self, run_id: str) -> bool:
        """Store run_id's prediction unless one is registered already (the first stands: a retry or a resumed
        run must not replace it after the run started). True when this call wrote it."""
        path = self.sweep_dir / run_id / FILE
        e = self.entries.get(run_id)
        if path.exists() or e is None:
            return False
        L = e.layout  # a PlanEntry (launcher.planning)
        record = {"run_id": run_id, "strategy": L.strategy, "F": L.F, "R": L.R, "S": L.S, "A": L.A,
                  "placement": self.rank_order, "model": model_name(e.model), "seq_len": e.train["seq_len"],
                  **{k: getattr(e, k) for k in PREDICTED}, "probe": self.probe,
                  "probe_sha256": self.probe_sha256, "commit": commit(), "predicted_at": utc_now()}
        write_atomic(path, json.dumps(record, indent=2) + "\n")
        return True


def load(sweep_dir: Path, run_ids: list[str]) -> dict[str, dict]:
    """The registered predictions of these runs, by run id (runs without one are left out)."""
    out = {}
    for run_id in run_ids:
        path = Path(sweep_dir) / run_id / FILE
        if path.is_file():
            out[run_id] = json.loads(path.read_text())
    return out
