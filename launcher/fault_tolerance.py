"""train.fault_tolerance=groups seen from the launcher: where fault-tolerant federation groups run so far, checked
before anything is submitted (train/federation/groups.py has how they run)."""
from __future__ import annotations

import importlib.util

from launcher import scheduler as schedulers
from launcher.settings import Settings
from launcher.sweep import Run
from train.contract.common import ConfigError


def check(settings: Settings, runs: list[Run]) -> None:
    """Refuse, before anything is submitted, fault-tolerant groups where they are not built yet: on cluster=local
    one job's supervisor restarts a lost group's process tree; a SLURM job per group is not written."""
    wanted = [run.run_id for run in runs if run.spec.train.fault_tolerance == "groups"]
    if wanted and not schedulers.of(settings.cluster).runs_here:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups runs on cluster=local only so far (one process "
                          f"tree per federation group); on SLURM ({settings.cluster.name}) use "
                          f"train.fault_tolerance=none")
    if wanted and importlib.util.find_spec("torchft") is None:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups needs torchft (pip install 'fedshard[ft]')")
    if wanted and settings.cluster.preflight:
        raise ConfigError(f"{wanted[0]}: train.fault_tolerance=groups starts each group's ranks apart, which "
                          f"cluster.preflight's check of the whole job does not do yet: set cluster.preflight=false")
