"""Reading text: documents from .txt / .jsonl / .parquet files and a tokenizer from a local directory.

Torch-free, so `python -m train.data.prepare` and its worker processes do not import torch."""
from __future__ import annotations

import json
from pathlib import Path

from train.contract.common import DataError


def documents(file: Path, key: str) -> list[str]:
    """The documents of one .txt (the whole file), .jsonl (field `key` per line) or .parquet (column `key`) file."""
    try:
        if file.suffix == ".txt":
            return [file.read_text(encoding="utf-8")]
        if file.suffix == ".jsonl":
            docs = []
            for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        doc = json.loads(line)
                    except json.JSONDecodeError:
                        raise DataError(f"{file}:{n}: line is not valid JSON") from None
                    if not isinstance(doc, dict) or not isinstance(doc.get(key), str):
                        raise DataError(f"{file}:{n}: no string field {key!r}")
                    docs.append(doc[key])
            return docs
        import pyarrow.parquet as pq  # imported here so synthetic runs do not pay for it

        if key not in pq.read_schema(file).names:
            raise DataError(f"{file}: no column {key!r}")
        docs = [d for d in pq.read_table(file, columns=[key]).column(key).to_pylist() if d is not None]
        if not all(isinstance(d, str) for d in docs):
            raise DataError(f"{file}: column {key!r} is not text")
        return docs
    except (OSError, ValueError) as e:  # ValueError covers UnicodeDecodeError and ArrowInvalid
        raise DataError(f"cannot read {file}: {e}") from None


def load_tokenizer(directory: str):
    """A fast tokenizer from a local directory (nothing is downloaded); DataError when it cannot be loaded."""
    from transformers import AutoTokenizer  # heavy import, only needed for text data

    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # transformers raises many types; all mean "unusable tokenizer"
        reason = " ".join(str(e).split())[:300]
        raise DataError(f"cannot load tokenizer from {directory}: {reason}") from None
