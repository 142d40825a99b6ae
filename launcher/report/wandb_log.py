"""Optional Weights & Biases logging of finished runs, grouped by sweep; offline unless the user opts in."""
from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.errors import ConfigError
from train.result import RunResult

MODES = ("offline", "online", "disabled")


def check(wandb_cfg: dict) -> None:
    """Fail before submitting anything if logging is asked for but impossible."""
    if not wandb_cfg.get("enabled"):
        return
    if wandb_cfg.get("mode") not in MODES:
        raise ConfigError(f"wandb.mode must be one of {', '.join(MODES)}, got {wandb_cfg.get('mode')!r}")
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError("wandb.enabled=true but the wandb package is not installed (pip install wandb)") from None


def log_run(wandb_cfg: dict, sweep: str, run_dir: Path) -> None:
    """Replay a finished run's metrics.jsonl and result.json into one W&B run named after the run id."""
    if not wandb_cfg.get("enabled"):
        return
    import wandb

    result = RunResult.load(run_dir / "result.json")
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=wandb_cfg.get("project", "fedshard"), group=sweep, name=result.run_id,
                     mode=wandb_cfg["mode"], dir=str(run_dir.parent),
                     config={k: getattr(result, k) for k in ("strategy", "F", "R", "S", "A", "world_size", "steps")})
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
    run.summary.update({k: v for k, v in result.to_dict().items() if isinstance(v, (int, float)) and v is not None})
    run.finish()
