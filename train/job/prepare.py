"""Data preparation as a job (launcher.actions.prepare submits it; train.data.prepare tokenizes): the job made after
the checks it would make first, so a bad tokenizer or a directory prepared with another one is refused before
anything is submitted."""
from __future__ import annotations

from pathlib import Path

from train.data.prepare import PrepareJob, Tokenizer, previous_index


def prepare_job(sources: tuple[str, ...], tokenizer: str, out: Path, workers: int, text_key: str,
                eval_fraction: float) -> PrepareJob:
    """The job that tokenizes `sources` with the tokenizer at `tokenizer` into `out` (train.data.prepare)."""
    tok = Tokenizer.at(tokenizer)
    previous_index(out, tok)
    return PrepareJob(sources, str(Path(tok.directory).resolve()), str(out), workers, text_key, eval_fraction)
