"""Tokenize a corpus once into token shards and an index, so that ranks memory-map it (data=tokens) instead of
each tokenizing it at start-up:

    python -m train.data.prepare PATHS... --tokenizer DIR --out DIR [--workers N] [--text-key K] [--eval-fraction F]

OUT holds one shard per source file, `shard-<key>.bin` (each document's ids followed by the end-of-sequence id,
as uint16 when the vocabulary fits, else uint32) with its record `shard-<key>.json` written after it, and
`index.json`, written last: the tokenizer (directory, hash, size, eos), the files in order (path, size, hash,
shard, documents, tokens), the totals and the held-out tail (`eval_tokens`, fixed here for every seq_len).
A shard's key hashes its file's contents, the tokenizer and the text key, so a rerun reuses every shard whose
record is there: it is idempotent (and says so), resumes after a kill without redoing finished shards, and
tokenizes again only the files that changed. Workers are processes (the tokenizer's own threads are off), one
file at a time; the progress line gives documents, tokens, tokens/s and the time left by bytes read.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from train.contract.common import DataError, atomic, write_atomic
from train.contract.sections import TextData
from train.contract.token_index import INDEX, VERSION, directory_hash, file_hash
from train.data.documents import documents

BATCH_DOCS = 1024  # documents per encode_batch call


@dataclass(frozen=True)
class Tokenizer:
    """A local fast tokenizer (tokenizer.json) with its end-of-sequence id; its hash covers every file of the
    directory, so another tokenizer, or the same one edited, is told apart."""

    directory: str
    hash: str
    size: int
    eos_id: int | None

    @classmethod
    def at(cls, directory: str) -> "Tokenizer":
        digest = directory_hash(directory)
        tok = _load(directory)
        eos = _eos_token(Path(directory))
        return cls(directory, digest, tok.get_vocab_size(with_added_tokens=True),
                   tok.token_to_id(eos) if eos else None)

    @property
    def dtype(self) -> str:
        return "uint16" if self.size <= 1 << 16 else "uint32"


def _eos_token(root: Path) -> str | None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = root / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if eos:
                return eos
    return None


_TOKENIZERS: dict[str, object] = {}


def _load(directory: str):
    """The `tokenizers` Tokenizer of a directory, once per process (a worker tokenizes many files)."""
    if directory not in _TOKENIZERS:
        from tokenizers import Tokenizer as Fast

        try:
            _TOKENIZERS[directory] = Fast.from_file(str(Path(directory) / "tokenizer.json"))
        except Exception as e:  # tokenizers raises plain Exceptions for a malformed file
            raise DataError(f"cannot load tokenizer from {directory}: {' '.join(str(e).split())[:300]}") from None
    return _TOKENIZERS[directory]


@dataclass(frozen=True)
class Job:
    """One source file to tokenize into one shard."""

    path: str
    size: int
    hash: str
    shard: str
    text_key: str


def shard_key(file_hash_: str, tokenizer_hash: str, text_key: str) -> str:
    return hashlib.blake2b(f"{file_hash_}/{tokenizer_hash}/{text_key}".encode(), digest_size=10).hexdigest()


def tokenize(job: Job, tok: Tokenizer, out: Path) -> dict:
    """Write the job's shard, then its record (both atomically); returns the record."""
    fast = _load(tok.directory)
    docs = [d for d in documents(Path(job.path), job.text_key) if d]
    parts, tokens = [], 0
    eos = [] if tok.eos_id is None else [tok.eos_id]
    for start in range(0, len(docs), BATCH_DOCS):
        for encoding in fast.encode_batch(docs[start:start + BATCH_DOCS], add_special_tokens=False):
            ids = np.asarray(encoding.ids + eos, dtype=tok.dtype)
            parts.append(ids)
            tokens += len(ids)
    shard = out / f"shard-{job.shard}.bin"
    with atomic(shard) as tmp:
        (np.concatenate(parts) if parts else np.zeros(0, tok.dtype)).tofile(tmp)
    record = {"path": job.path, "size": job.size, "hash": job.hash, "shard": shard.name, "documents": len(docs),
              "tokens": tokens}
    write_atomic(shard.with_suffix(".json"), json.dumps(record) + "\n")
    return record


def _reusable(out: Path, job: Job, tok: Tokenizer) -> dict | None:
    """The record of a finished shard for this job, when its shard has every byte it says it has."""
    path = out / f"shard-{job.shard}.json"
    try:
        record = json.loads(path.read_text())
        size = (out / record["shard"]).stat().st_size
    except (OSError, ValueError, KeyError):
        return None
    if record.get("hash") != job.hash or size != record["tokens"] * np.dtype(tok.dtype).itemsize:
        return None
    return {**record, "path": job.path}


class Progress:
    """One line of documents, tokens, tokens/s and time left (by bytes), rewritten in place on a terminal and
    printed every few seconds elsewhere (a batch job's log)."""

    def __init__(self, total_bytes: int, stream=None, every_s: float = 5.0):
        # stderr as it is when the work starts, not when this module was imported (a test may have replaced it)
        self.total, self.stream, self.every_s = total_bytes, stream or sys.stderr, every_s
        self.bytes = self.documents = self.tokens = 0
        self.start = self.last = time.monotonic()
        self.tty = self.stream.isatty()

    def add(self, record: dict) -> None:
        self.bytes += record["size"]
        self.documents += record["documents"]
        self.tokens += record["tokens"]
        now = time.monotonic()
        if self.tty or now - self.last >= self.every_s or self.bytes == self.total:
            self.last = now
            self.stream.write(("\r" if self.tty else "") + self.line() + ("" if self.tty else "\n"))
            self.stream.flush()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        left = elapsed * (self.total - self.bytes) / self.bytes if self.bytes else float("nan")
        return (f"prepare: {self.bytes / max(self.total, 1):6.1%} of {self.total / 1e6:,.1f} MB, "
                f"{self.documents:,} documents, {self.tokens:,} tokens, {self.tokens / elapsed:,.0f} tokens/s, "
                f"{left:,.0f} s left")

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")


def prepare(paths: list[str], tokenizer: str, out: Path, workers: int = 1, text_key: str = "text",
            eval_fraction: float = 0.01, stream=None) -> tuple[dict, str]:
    """Tokenize what `paths` hold into `out`; returns the index and what was done, in one line."""
    files = TextData(paths=list(paths), tokenizer=tokenizer, text_key=text_key).files()
    if not 0 < eval_fraction < 1:
        raise DataError(f"--eval-fraction must be in (0, 1), got {eval_fraction}")
    tok = Tokenizer.at(tokenizer)
    previous = previous_index(out, tok)
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / INDEX
    jobs = []
    for f in files:
        digest = file_hash(f)
        jobs.append(Job(str(f.resolve()), f.stat().st_size, digest, shard_key(digest, tok.hash, text_key), text_key))
    records: dict[str, dict] = {j.shard: r for j in jobs if (r := _reusable(out, j, tok)) is not None}
    todo = [j for j in jobs if j.shard not in records]
    if previous is not None and not todo and _index(jobs, records, tok, text_key, eval_fraction) == previous:
        return previous, f"{out} is up to date: {len(jobs)} shard(s), {previous['tokens']:,} tokens; nothing to do"
    progress = Progress(sum(j.size for j in todo), stream)
    if workers > 1 and len(todo) > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker process
        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            futures = {pool.submit(tokenize, j, tok, out): j for j in todo}
            for future in as_completed(futures):
                records[futures[future].shard] = future.result()
                progress.add(records[futures[future].shard])
    else:
        for j in todo:
            records[j.shard] = tokenize(j, tok, out)
            progress.add(records[j.shard])
    progress.done()
    index = _index(jobs, records, tok, text_key, eval_fraction)
    if index["tokens"] == 0:
        raise DataError(f"the corpus {', '.join(paths)} holds no text: nothing to train on")
    write_atomic(index_path, json.dumps(index, indent=1) + "\n")
    kept = {r["shard"] for r in records.values()} | {Path(r["shard"]).with_suffix(".json").name
                                                     for r in records.values()}
    for stale in [*out.glob("shard-*"), *out.glob(".shard-*.tmp*")]:  # changed or gone files; a killed write
        if stale.name not in kept:
            stale.unlink()
    reused = len(jobs) - len(todo)
    changed = (f" ({len(todo)} changed or new file(s), {reused} reused)" if previous is not None
               else f" ({reused} shard(s) reused from an interrupted run)" if reused else "")
    return index, (f"prepared {out}: {len(jobs)} shard(s), {index['documents']:,} documents, {index['tokens']:,} "
                   f"tokens ({index['dtype']}), {index['eval_tokens']:,} held out{changed}")


def previous_index(out: Path, tok: Tokenizer) -> dict | None:
    """The index an earlier preparation left in `out`, refused when another tokenizer wrote it (the launcher asks
    before submitting a preparation, so the refusal comes before the job)."""
    path = out / INDEX
    previous = json.loads(path.read_text()) if path.exists() else None
    if previous is not None and previous["tokenizer"]["hash"] != tok.hash:
        raise DataError(f"{out} was prepared with tokenizer {previous['tokenizer']['hash']} "
                        f"({previous['tokenizer']['directory']}), not {tok.hash} ({tok.directory}): prepare into "
                        f"another directory")
    return previous


@dataclass(frozen=True)
class PrepareJob:
    """prepare() as the callable of a submitit job (launcher action=prepare); returns what was done, in one line."""

    paths: tuple[str, ...]
    tokenizer: str
    out: str
    workers: int
    text_key: str
    eval_fraction: float

    def __call__(self) -> str:
        return prepare(list(self.paths), self.tokenizer, Path(self.out), self.workers, self.text_key,
                       self.eval_fraction)[1]


def _index(jobs: list[Job], records: dict[str, dict], tok: Tokenizer, text_key: str, eval_fraction: float) -> dict:
    ordered = [records[j.shard] for j in jobs]
    tokens = sum(r["tokens"] for r in ordered)
    return {"version": VERSION, "tokenizer": {"directory": tok.directory, "hash": tok.hash, "size": tok.size,
                                              "eos_id": tok.eos_id},
            "dtype": tok.dtype, "text_key": text_key, "eval_fraction": eval_fraction,
            "files": ordered, "documents": sum(r["documents"] for r in ordered), "tokens": tokens,
            "eval_tokens": round(eval_fraction * tokens)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.data.prepare", description=__doc__.split("\n\n")[0],
                                     epilog="Each run of fedshard then reads it with data=tokens data.path=OUT.")
    parser.add_argument("paths", nargs="+", help=".txt / .jsonl / .parquet files or directories")
    parser.add_argument("--tokenizer", required=True, help="a local tokenizer directory (tokenizer.json)")
    parser.add_argument("--out", required=True, type=Path, help="where the shards and index.json go")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="tokenizer processes (default: this machine's CPUs)")
    parser.add_argument("--text-key", default="text", help="the field (jsonl) or column (parquet) holding text")
    parser.add_argument("--eval-fraction", type=float, default=0.01, help="tail of the tokens held out")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    try:
        _, said = prepare(args.paths, args.tokenizer, args.out, args.workers, args.text_key, args.eval_fraction)
    except DataError as e:
        print(f"fedshard: error: {e}", file=sys.stderr)
        return 2
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
