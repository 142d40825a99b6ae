"""Preparation throughput and batch read latency of prepared token data (issue 5/6's targets).

1. `train.data.prepare` with --workers 2 against the same tokenizer's batch encode of the same documents in one
   process with TOKENIZERS_PARALLELISM=false (target: >= 1.6x), alternating which goes first, median of the
   repeats; both read the files, prepare also hashes them and writes the shards and index.
2. One batch of 8 x 2,048 tokens drawn from the memory-mapped shards (`TokensSource.train_batch`), median over
   many steps (target: <= 1 ms).

A synthetic corpus (random words, several .jsonl files) and a byte-level BPE tokenizer trained on it are
generated in a temporary directory. Run: python -m bench.data [--files 8] [--docs 1500] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

PREPARE_TARGET, READ_TARGET_S = 1.6, 1e-3


def corpus(root: Path, files: int, docs: int, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 10))) for _ in range(5000)]
    paths = []
    for f in range(files):
        path = root / f"part{f:03d}.jsonl"
        lines = (json.dumps({"text": " ".join(rng.choice(words, size=rng.integers(100, 400)))}) for _ in range(docs))
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def tokenizer(root: Path, sample: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [json.loads(line)["text"] for line in sample.read_text().splitlines()]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<eos>"]))
    path = root / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(path)
    return path


def one_process(files: list[Path], tok_dir: Path) -> float:
    """Seconds to read every document and batch-encode them with the fast tokenizer, one thread."""
    from tokenizers import Tokenizer

    from train.data.documents import documents

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    fast = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    start = time.perf_counter()
    for f in files:
        docs = documents(f, "text")
        for i in range(0, len(docs), 1024):
            fast.encode_batch(docs[i:i + 1024], add_special_tokens=False)
    return time.perf_counter() - start


def prepared(files: list[Path], tok_dir: Path, out: Path, workers: int) -> float:
    from train.data.prepare import prepare

    start = time.perf_counter()
    prepare([str(f) for f in files], str(tok_dir), out, workers=workers, stream=open(os.devnull, "w"))
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--docs", type=int, default=1500, help="documents per file (100-400 words each)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "corpus").mkdir()
        files = corpus(root / "corpus", args.files, args.docs)
        tok_dir = tokenizer(root, files[0])
        single, parallel = [], []
        for r in range(args.repeats):
            out = root / f"tokens{r}"
            if r % 2:
                parallel.append(prepared(files, tok_dir, out, args.workers))
                single.append(one_process(files, tok_dir))
            else:
                single.append(one_process(files, tok_dir))
                parallel.append(prepared(files, tok_dir, out, args.workers))
        index = json.loads((root / "tokens0" / "index.json").read_text())
        one, many = statistics.median(single), statistics.median(parallel)
        print(f"corpus: {args.files} files, {index['documents']:,} documents, {index['tokens']:,} tokens "
              f"({sum(f.stat().st_size for f in files) / 1e6:.1f} MB), BPE vocabulary {index['tokenizer']['size']}")
        print(f"one process, batch encode: {one:.2f} s ({index['tokens'] / one:,.0f} tokens/s)")
        print(f"train.data.prepare --workers {args.workers}: {many:.2f} s ({index['tokens'] / many:,.0f} tokens/s)")
        print(f"speed-up {one / many:.2f}x (target >= {PREPARE_TARGET}x): "
              + ("met" if one / many >= PREPARE_TARGET else f"missed by {PREPARE_TARGET - one / many:.2f}"))
        read_latency(root / "tokens0")


def read_latency(directory: Path, steps: int = 500) -> None:
    from train.contract.sections import TokensData
    from train.data.tokens import TokensSource

    seq, batch = 2048, 8
    index = json.loads((directory / "index.json").read_text())
    ranks = max(1, (index["tokens"] - index["eval_tokens"]) // seq // batch)
    source = TokensSource(TokensData(path=str(directory)), 1 << 20, seq, 0)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        rank = step % ranks  # one rank's batch a read, the ranks of a step in turn
        source.train_batch(step // ranks, range(rank * batch, (rank + 1) * batch), ranks * batch, seq)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"batch of {batch} x {seq} tokens from the shards: median {median * 1e3:.3f} ms over {steps} reads, "
          f"{median / READ_TARGET_S:.2f}x the {READ_TARGET_S * 1e3:g} ms target: "
          + ("met" if median <= READ_TARGET_S else "missed"))


if __name__ == "__main__":
    main()
