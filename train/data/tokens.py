"""data=tokens: a prepared directory (train.data.prepare) memory-mapped, so a rank's memory does not grow with the
corpus, and sampled without replacement: one epoch sees every training block exactly once.

The training tokens (all but the held-out tail) are read as consecutive blocks of seq_len. Draw p of a run, for
row g of step t's global batch of B sequences, is p = t x B + g: the data-parallel ranks of one step take
disjoint rows, and every step the next B draws. Draw p is block perm_e[p mod n] of epoch e = p div n, perm_e a
permutation seeded by (seed, e). A step's sequences are therefore a pure function of (seed, t, B), whatever the
layout: resuming needs no iterator state, and no block repeats within an epoch or is skipped. (An elastic resume
that changes B renumbers the draws from there on.)
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from train.contract import token_index
from train.contract.sections import TokensData
from train.data.token_source import TokenSource, unigram_ppl

_PERMUTATION = 3  # SeedSequence domain tag (train.data.sources uses 0-2)


class TokensSource(TokenSource):
    """A prepared directory's blocks of seq_len tokens, drawn without replacement."""

    def __init__(self, data: TokensData, model_vocab: int, seq_len: int, seed: int,
                 global_batch: int | None = None, steps: int | None = None):
        self.index = token_index.load(data.path, data.tokenizer)
        if global_batch is not None:
            token_index.check_run(self.index, data.path, model_vocab, seq_len, global_batch, steps, data.epochs)
        dtype = np.dtype(self.index["dtype"])
        self.shards = [np.memmap(Path(data.path) / r["shard"], dtype=dtype, mode="r") if r["tokens"] else
                       np.zeros(0, dtype) for r in self.index["files"]]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])  # each shard's first token in the stream
        self.n_train, self.n_eval = token_index.blocks(self.index, seq_len)
        self.eval_start = self.index["tokens"] - self.index["eval_tokens"]
        self.vocab_size, self.floor_ppl = self.index["tokenizer"]["size"], None
        self.seq_len, self.seed, self.path = seq_len, seed, data.path
        self.baseline_ppl = unigram_ppl(self.eval_set(seq_len), self.vocab_size)

    def _tokens(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count) of the whole stream, across shard boundaries."""
        out = np.empty(count, np.int64)
        done = 0
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while done < count:
            offset = start + done - self.starts[shard]
            piece = self.shards[shard][offset:offset + count - done]
            out[done:done + len(piece)] = piece
            done += len(piece)
            shard += 1
        return out

    @functools.lru_cache(maxsize=2)
    def permutation(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _PERMUTATION, epoch]))
        return rng.permutation(self.n_train)

    def block_indices(self, step: int, rows: range, global_batch: int) -> list[tuple[int, int]]:
        """(epoch, block) of each of these rows of step `step`'s global batch."""
        first = step * global_batch
        return [(p // self.n_train, int(self.permutation(p // self.n_train)[p % self.n_train]))
                for p in range(first + rows.start, first + rows.stop)]

    def train_batch(self, step: int, rows: range, global_batch: int, seq_len: int) -> torch.LongTensor:
        self._check_len(seq_len)
        self._check_rows(rows, global_batch)
        blocks = self.block_indices(step, rows, global_batch)
        return torch.from_numpy(np.stack([self._tokens(block * seq_len, seq_len) for _, block in blocks]))

    def eval_set(self, seq_len: int) -> torch.LongTensor:
        self._check_len(seq_len)
        return torch.from_numpy(self._tokens(self.eval_start, self.n_eval * seq_len).reshape(self.n_eval, seq_len))

    def describe(self) -> dict:
        return {"kind": "tokens", "path": self.path, "vocab": self.vocab_size, "floor_ppl": None,
                "baseline_ppl": self.baseline_ppl, "tokenizer_hash": self.index["tokenizer"]["hash"],
                "dtype": self.index["dtype"], "seq_len": self.seq_len, "train_blocks": self.n_train,
                "eval_blocks": self.n_eval}

    def seen(self, tokens: int) -> dict:
        """What a run that trained `tokens` tokens drew: blocks (with repeats past one epoch) and epochs."""
        drawn = tokens // self.seq_len
        return {"blocks_seen": drawn, "epochs": drawn / self.n_train}
