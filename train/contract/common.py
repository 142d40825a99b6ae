"""What launcher/ and train/ share: the user-facing failures (each one becomes a single clear line and a non-zero
exit), and files that readers never see half written (every result, plan, manifest, spec, heartbeat and shard is
written to a temporary name beside the file, then renamed)."""
from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic(path: Path) -> Iterator[Path]:
    """A temporary path to write `path`'s content to; renamed over `path` when the block ends without an error,
    removed when it raises."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Write text via a temporary file and rename, so readers never see half a file."""
    with atomic(path) as tmp:
        tmp.write_text(text)


def free_port() -> int:
    """A port free on this host now (a rendezvous on one machine: local ranks, a federation group's world)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class FedshardError(Exception):
    """Base of every error the entrypoints report as one line instead of a traceback."""


class SpecError(FedshardError):
    """The run spec is invalid (layout, strategy, A, F, unknown keys)."""


class DataError(FedshardError):
    """The data source cannot be built (missing paths, tokenizer, empty data)."""


class AlignmentError(FedshardError):
    """Federation groups would average parameter slices that do not correspond."""


class Stopped(FedshardError):
    """The scheduler asked the run to stop; a checkpoint was saved and the same command resumes it."""


class NonFiniteError(FedshardError):
    """A loss or gradient was NaN or inf (train.runtime.nonfinite); the run stopped before averaging or saving it, and a
    rerun would fail the same way."""


# The launcher's failures: reported before anything is submitted. Only these and the ones above become
# `fedshard: error: ...`; any other exception is a bug in fedshard and keeps its traceback.
class ConfigError(FedshardError):
    """The composed configuration (cluster, sweep, overrides, topology snapshot) is invalid."""


class SubmitError(FedshardError):
    """Launching is impossible in this environment (no sbatch or srun, outside the testbed's namespace)."""


class SlurmError(FedshardError):
    """A SLURM command (scontrol, squeue) is missing, failed or did not answer."""


class StateError(FedshardError):
    """What a previous launcher left on disk cannot be used: manifest, results, another launcher's lock."""


class PreflightError(FedshardError):
    """A job's preflight (cluster.preflight) found a slow device or link on the nodes it got; the launcher retries
    the run without them."""
