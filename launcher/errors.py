"""Launcher failures reported as one line and a non-zero exit, before anything is submitted.

Only these (and train's FedshardError family) become `fedshard: error: ...`: any other exception is a bug
in fedshard and keeps its traceback, so a bug is never mistaken for bad input.
"""
from train.common import FedshardError


class ConfigError(FedshardError):
    """The composed configuration (cluster, sweep, overrides, topology snapshot) is invalid."""


class SubmitError(FedshardError):
    """Launching is impossible in this environment (no sbatch or srun, outside the testbed's namespace)."""


class SlurmError(FedshardError):
    """A SLURM command (scontrol, squeue) is missing, failed or did not answer."""


class StateError(FedshardError):
    """What a previous launcher left on disk cannot be used: manifest, results, another launcher's lock."""
