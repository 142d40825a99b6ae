"""Launcher failures reported as one line and a non-zero exit, before anything is submitted."""
from train.errors import FedshardError


class ConfigError(FedshardError):
    """The composed configuration (cluster, sweep, overrides) is invalid."""


class SubmitError(FedshardError):
    """Submission is impossible in this environment (no sbatch, no partition, ...)."""
