"""User-facing failures: each one becomes a single clear line and a non-zero exit."""


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
    """A loss or gradient was NaN or inf (train.nonfinite); the run stopped before averaging or saving it, and a
    rerun would fail the same way."""
