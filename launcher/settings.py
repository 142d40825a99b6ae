"""Compose the Hydra config (conf/) and turn it into plain, validated settings.

We use Hydra's compose API rather than @hydra.main so every configuration
mistake becomes one line and exit code 2, and so one invocation is one sweep.
"""
from __future__ import annotations

import re

from dataclasses import dataclass, field, fields
from pathlib import Path

from .errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
ACTIONS = ("run", "plan", "report")


@dataclass
class Cluster:
    name: str
    executor: str
    nodes: int
    gpus_per_node: int
    device: str
    backend: str
    time_min: int
    max_ranks: int | None = None
    peak_flops: float | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    setup: list = field(default_factory=list)
    sbatch_extra: dict = field(default_factory=dict)
    snapshot: str | None = None
    bandwidth_GBps: list = field(default_factory=list)
    nodes_per_level: list = field(default_factory=list)
    placement: str = "in_job"
    switches_wait_min: int = 5
    sequential: bool = False      # submit one run at a time (always so for the local executor)
    netns: str | None = None      # clients must run inside this network namespace (the testbed)
    network: dict | None = None   # the testbed's network description (slurm/testbed/testbed.py)

    @property
    def bandwidth(self) -> list[float]:
        """Per-level bandwidth in bytes/s."""
        return [b * 1e9 for b in self.bandwidth_GBps]

    def validate(self) -> "Cluster":
        if self.executor not in ("local", "slurm"):
            raise ConfigError(f"cluster.executor must be local or slurm, got {self.executor!r}")
        for key in ("nodes", "gpus_per_node", "time_min"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"cluster.{key} must be a positive integer, got {getattr(self, key)!r}")
        # Values land on #SBATCH lines of a script: a line break would start a shell command there.
        values = {"partition": self.partition, "account": self.account, "qos": self.qos,
                  **{f"setup[{i}]": v for i, v in enumerate(self.setup)},
                  **{f"sbatch_extra.{k}": v for k, v in self.sbatch_extra.items()}}
        for key, value in values.items():
            if isinstance(value, str) and any(c in value for c in "\n\r\0"):
                raise ConfigError(f"cluster.{key} contains a line break or NUL, which would end up as shell "
                                  f"text in the sbatch script: {value!r}")
        if self.placement not in ("in_job", "pinned"):
            raise ConfigError(f"cluster.placement must be in_job or pinned, got {self.placement!r}")
        if self.executor == "slurm" and not self.partition:
            raise ConfigError(f"cluster {self.name!r} has no partition: set cluster.partition=NAME "
                              f"(see `sinfo -s` for the partitions you can use)")
        return self


@dataclass
class Sweep:
    name: str
    strategies: list
    A: list
    F: list
    nodes: list
    paper_nodes: int | None = None
    repeats: int = 1
    exclude: list = field(default_factory=list)
    train: dict = field(default_factory=dict)


@dataclass
class Settings:
    action: str
    results_dir: Path
    retries: int
    poll_s: float
    cluster: Cluster
    sweep: Sweep
    model: dict
    train: dict
    data: dict
    wandb: dict

    @property
    def sweep_dir(self) -> Path:
        return self.results_dir / self.sweep.name


def _typed(cls, raw: dict, where: str):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown {where} key(s): {', '.join(unknown)}")
    try:
        return cls(**raw)
    except TypeError as exc:  # a required key is missing
        raise ConfigError(f"{where}: {exc}") from None


def compose(overrides: list[str]) -> Settings:
    """Hydra overrides (`sweep=paper_table3 cluster=leonardo ...`) -> validated Settings."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = hydra_compose("config", overrides=overrides)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(_first_line(exc)) from None
    raw.pop("hydra", None)
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"unknown top-level key(s): {', '.join(unknown)}")
    if raw["action"] not in ACTIONS:
        raise ConfigError(f"action must be one of {', '.join(ACTIONS)}, got {raw['action']!r}")
    return Settings(
        action=raw["action"], results_dir=Path(raw["results_dir"]).resolve(), retries=int(raw["retries"]),
        poll_s=float(raw["poll_s"]), cluster=_typed(Cluster, raw["cluster"], "cluster").validate(),
        sweep=_typed(Sweep, raw["sweep"], "sweep"), model=raw["model"], train=raw["train"], data=raw["data"],
        wandb=raw["wandb"])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else type(exc).__name__
    missing = re.search(r"Could not (?:find|load) '([^'/]+)/", msg)
    if missing:  # name what exists, e.g. "(available sweep: paper_table3, smoke, ...)"
        group = missing.group(1)
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        msg += f" (available {group}: {', '.join(options)})"
    elif msg.startswith("Could not override"):
        msg = msg.rstrip(".") + ": no such key (the keys are in conf/)"
    return msg
