"""Files that readers never see half written: every result, plan, manifest, spec, heartbeat and shard the
launcher and the trainer write goes through here (a temporary name beside the file, then one rename)."""
from __future__ import annotations

import os
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
