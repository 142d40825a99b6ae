"""A prepared token directory's index (train.data.prepare), read and checked without torch: the launcher refuses a
bad directory or a run it cannot feed before anything is submitted, and the ranks check the same again."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from train.contract.common import DataError

INDEX = "index.json"  # in a prepared directory, beside its shards
VERSION = 1


def file_hash(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def directory_hash(directory: str) -> str:
    """A tokenizer directory's hash: every file's name and contents (so a run can check a prepared directory's
    tokenizer without loading it)."""
    root = Path(directory)
    if not (root / "tokenizer.json").is_file():
        raise DataError(f"tokenizer directory {directory} has no tokenizer.json (a fast tokenizer is needed)")
    digest = hashlib.blake2b(digest_size=16)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f.relative_to(root).as_posix().encode() + b"\0" + file_hash(f).encode())
    return digest.hexdigest()


def load(directory: str, tokenizer: str | None = None) -> dict:
    """The index of `directory`, its shards checked for every byte; with `tokenizer`, that it is the one the
    directory was prepared with."""
    path = Path(directory) / INDEX
    if not path.is_file():
        raise DataError(f"{directory} holds no {INDEX}: prepare it first (python -m train.data.prepare PATHS "
                        f"--tokenizer DIR --out {directory})")
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path} cannot be read: {e}") from None
    if index.get("version") != VERSION:
        raise DataError(f"{path} is version {index.get('version')!r}, this fedshard reads {VERSION}: prepare again")
    if tokenizer is not None:
        hashed = directory_hash(tokenizer)
        if hashed != index["tokenizer"]["hash"]:
            raise DataError(f"data.tokenizer {tokenizer} (hash {hashed}) is not the tokenizer {directory} was "
                            f"prepared with ({index['tokenizer']['directory']}, hash {index['tokenizer']['hash']})")
    itemsize = np.dtype(index["dtype"]).itemsize
    for record in index["files"]:
        shard = Path(directory) / record["shard"]
        expected = record["tokens"] * itemsize
        found = shard.stat().st_size if shard.is_file() else None
        if found != expected:
            state = "missing" if found is None else f"truncated ({found:,} bytes)"
            raise DataError(f"shard {shard} is {state}: expected {expected:,} bytes ({record['tokens']:,} tokens "
                            f"of {record['path']}); prepare again")
    return index


def blocks(index: dict, seq_len: int) -> tuple[int, int]:
    """(training blocks, held-out blocks) of seq_len tokens: sequences are packed at read time, so one prepared
    directory serves any length; the held-out tail was fixed at preparation."""
    return (index["tokens"] - index["eval_tokens"]) // seq_len, index["eval_tokens"] // seq_len


def check_run(index: dict, directory: str, model_vocab: int, seq_len: int, global_batch: int, steps: int,
              epochs: float | None) -> None:
    """Refuse a run this directory cannot feed: a vocabulary the model lacks, fewer training blocks than one
    global batch, no held-out block, or (data.epochs) steps that do not cover exactly that many epochs."""
    if index["tokenizer"]["size"] > model_vocab:
        raise DataError(f"{directory} was tokenized with a vocabulary of {index['tokenizer']['size']:,} but the "
                        f"model has {model_vocab:,} embeddings")
    train, held_out = blocks(index, seq_len)
    if train < global_batch:
        raise DataError(f"{directory} holds {train:,} training block(s) of seq_len {seq_len}, fewer than one "
                        f"global batch of {global_batch:,} sequences")
    if held_out < 1:
        raise DataError(f"{directory} holds out {index['eval_tokens']:,} tokens, not one block of seq_len "
                        f"{seq_len}: prepare it with a larger --eval-fraction")
    if epochs is not None and steps != (needed := int(epochs * train // global_batch)):
        raise DataError(f"data.epochs={epochs:g} of {directory} ({train:,} blocks of {seq_len} tokens) takes "
                        f"{needed:,} steps of {global_batch:,} sequences, but train.steps={steps:,}")
