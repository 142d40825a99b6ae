"""What the trainer needs from a data source (TokenSource), and the baseline every packed source reports: the
perplexity of the eval data's own unigram frequencies. Its own module, so that each kind of source (train.data.sources's
synthetic and text, train.data.tokens' prepared tokens) builds on it without importing the others."""
import math
from abc import ABC, abstractmethod

import numpy as np
import torch

from train.contract.common import DataError


def entropy(p: np.ndarray) -> float:
    """Shannon entropy in nats of a probability vector (zero entries contribute nothing)."""
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def unigram_ppl(eval_blocks: torch.Tensor, vocab: int) -> float:
    """baseline_ppl of packed text: the perplexity of the eval blocks' own unigram frequencies over the tokens eval
    perplexity scores (labels shift by one), the best context-free model of exactly that data."""
    predicted = eval_blocks[:, 1:].reshape(-1).numpy()
    return math.exp(entropy(np.bincount(predicted, minlength=vocab) / predicted.size))


class TokenSource(ABC):
    """What the trainer needs from data: stateless batches, a fixed eval set, a summary."""

    vocab_size: int
    floor_ppl: float | None
    baseline_ppl: float  # the best context-free model's perplexity on the eval data (see the module docstring)

    @abstractmethod
    def train_batch(self, step: int, rows: range, global_batch: int, seq_len: int) -> torch.LongTensor:
        """[len(rows), seq_len] ids: rows `rows` of step `step`'s global batch of `global_batch` sequences, a pure
        function of (seed, step, global_batch, seq_len) and the rows, whoever draws them (any layout on any
        number of data-parallel ranks trains on the same sequences)."""

    @abstractmethod
    def eval_set(self, seq_len: int) -> torch.LongTensor:
        """[n_eval, seq_len] held-out ids, identical on every rank and every call."""

    @abstractmethod
    def describe(self) -> dict:
        """Small JSON-able summary written into result files."""

    @staticmethod
    def _check_rows(rows: range, global_batch: int) -> None:
        if rows.step != 1 or not 0 <= rows.start < rows.stop <= global_batch:
            raise DataError(f"rows {rows} are not a slice of a global batch of {global_batch} sequences")

    def _check_len(self, seq_len: int) -> None:
        """Packed sources are opened for one seq_len (their block counts and baseline depend on it)."""
        if seq_len != self.seq_len:
            raise DataError(f"{self.describe()['kind']} data was opened for seq_len {self.seq_len}, asked for "
                            f"{seq_len}")

    def seen(self, tokens: int) -> dict:
        """What a run that trained `tokens` tokens drew from this source, for result.json (nothing to say for
        sources drawn with replacement)."""
        return {}
