"""Optional Weights & Biases logging of finished runs, grouped by sweep; offline unless the user opts in."""
from __future__ import annotations

import json
import os
from pathlib import Path

from train.contract.common import ConfigError
from train.contract.result import RunResult


def check(wandb_cfg) -> None:
    """Fail before submitting anything if logging is asked for but impossible (its keys' types and mode are
    checked when the settings are composed)."""
    if not wandb_cfg.enabled:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("wandb.enabled=true but the wandb package is not installed: "
                          "pip install 'fedshard[wandb]'") from None


class LiveRun:
    """One W&B run fed while its job trains: every poll logs the metrics.jsonl rows written since the last
    (complete lines only; steps already logged are skipped, as after a resume that trimmed the file)."""

    def __init__(self, wandb_cfg, sweep: str, run_dir: Path, config: dict):
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.path, self.offset, self.last_step = run_dir / "metrics.jsonl", 0, 0
        self.run = wandb.init(project=wandb_cfg.project, group=sweep, name=run_dir.name,
                              mode=wandb_cfg.mode, dir=str(run_dir.parent), config=config, reinit="create_new")

    def feed(self) -> int:
        """Log the new rows; returns how many."""
        try:
            with open(self.path, "rb") as fh:
                if fh.seek(0, os.SEEK_END) < self.offset:
                    self.offset = 0  # rewritten (a resume keeps the rows its checkpoint covers)
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return 0
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        logged = 0
        for line in complete.splitlines():
            row = json.loads(line)
            if row["step"] > self.last_step:
                self.run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
                self.last_step, logged = row["step"], logged + 1
        return logged

    def finish(self, result: RunResult | None) -> None:
        """The last rows, the result's numbers as the summary; a run without a result finishes as failed."""
        self.feed()
        if result is not None:
            self.run.summary.update({k: v for k, v in result.to_dict().items()
                                     if isinstance(v, (int, float)) and v is not None})
        self.run.finish(exit_code=0 if result is not None else 1)


def open_run(wandb_cfg, sweep: str, run_dir: Path, spec) -> LiveRun | None:
    """A LiveRun for a submitted run when W&B logging is on."""
    if not wandb_cfg.enabled:
        return None
    return LiveRun(wandb_cfg, sweep, run_dir, {k: getattr(spec.layout, k) for k in ("strategy", "F", "R", "S", "A")}
                   | {"world_size": spec.world_size, "steps": spec.train.steps})


def sync_hint(wandb_cfg, sweep_dir: Path) -> str | None:
    """Where offline runs are and the command that uploads them."""
    if not wandb_cfg.enabled or wandb_cfg.mode != "offline":
        return None
    return (f"W&B offline runs are in {sweep_dir / 'wandb'}; upload them with: "
            f"wandb sync {sweep_dir / 'wandb'}/offline-run-*")
