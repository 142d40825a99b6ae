"""Token sources for training: a synthetic Markov chain with a known floor, or packed local text.

A source is stateless: the sequences of global step t are a pure function of (seed, t, global batch,
seq_len), and data-parallel rank d of D takes rows [d·b, (d+1)·b) of them (b = global batch / D; the ranks are
numbered federation group first, so a group takes a fixed slice too). Every layout of the same global batch,
whatever its tp, pp or data-parallel degree, therefore trains on the same sequences, and resuming from a
checkpoint needs no iterator state. Row g of step t is drawn from draws [g·n, (g+1)·n) of one generator
seeded by (seed, t) (n draws a row; the generator is advanced to the slice, not run through the rows before
it). Generators are seeded from ``SeedSequence([seed, domain, ...])``;
the domain tag keeps chain construction, training and eval draws apart (SeedSequence
zero-pads short entropy, so ``[s, a]`` and ``[s, a, 0]`` would otherwise collide).

``data`` section schema (train.contract.sections; unknown keys are a DataError):

``{"kind": "synthetic", "vocab": int = min(model_vocab, 512), "branching": int = 8,
"eval_sequences": int = 64}``
    A seeded first-order Markov chain: every state i moves to ``branching`` distinct
    successors (always including (i + 1) % vocab, which makes the chain irreducible)
    with Dirichlet(1) probabilities. Each sequence starts from the stationary
    distribution pi, so every predicted position has expected cross-entropy equal to
    the entropy rate H = sum_i pi_i H(P_i) nats; ``floor_ppl = exp(H)`` is the best
    perplexity any model can reach. Every position is distributed as pi, so the best
    context-free model (a unigram) scores ``baseline_ppl = exp(H(pi))``: a model that has
    learned anything of the chain's context is below it. The eval set comes from its own
    seed domain.

``{"kind": "text", "paths": [file or dir, ...], "tokenizer": "/local/dir",
"eval_fraction": float = 0.01, "text_key": "text"}``
    Reads .txt (whole file = one document), .jsonl (field text_key per line) and
    .parquet (column text_key) files; directories are searched recursively in sorted
    order. Documents are tokenized with a local ``AutoTokenizer``, joined with
    eos_token_id (if the tokenizer has one), packed into blocks of seq_len tokens
    (tail dropped); the last max(1, round(eval_fraction * n_blocks)) blocks are held
    out for eval. Training draws block indices *with replacement*, row g of step t from
    the generator seeded by (seed, t) advanced g draws, which keeps batches stateless. ``baseline_ppl`` is the
    perplexity of the eval set's own unigram frequencies over its predicted tokens (the best
    context-free model of exactly that data, counted).
"""
import math

import numpy as np
import torch

from train.contract.common import DataError
from train.contract.sections import DataSection, SyntheticData, TextData, TokensData, data_section
from train.data.documents import documents, load_tokenizer
from train.data.token_source import TokenSource, entropy, unigram_ppl
from train.data.tokens import TokensSource

_CHAIN, _TRAIN, _EVAL = 0, 1, 2  # SeedSequence domain tags


def _rng(seed: int, domain: int, *ids: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, domain, *ids]))


def _row_draws(seed: int, step: int, rows: range, per_row: int) -> np.ndarray:
    """[len(rows), per_row] uniforms in [0, 1): rows `rows` of the ones step `step` draws, row g being draws
    [g·per_row, (g+1)·per_row) of one generator seeded by (seed, step), advanced past the rows before it (PCG64
    draws one 64-bit word per double, so any slice equals the same rows of the whole batch's draws)."""
    bits = np.random.PCG64(np.random.SeedSequence([seed, _TRAIN, step]))
    bits.advance(rows.start * per_row)
    return np.random.Generator(bits).random((len(rows), per_row))


def _in_range(key: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        raise DataError(f"data.{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


class SyntheticSource(TokenSource):
    """Markov chain whose entropy rate is known exactly, so loss can be judged against a floor.

    ``successors[i]`` / ``probs[i]`` give state i's transition row, ``stationary`` is pi.
    """

    def __init__(self, vocab: int, branching: int, eval_sequences: int, seed: int):
        rng = _rng(seed, _CHAIN)
        others = np.concatenate([[0], np.arange(2, vocab)])  # every offset except the forced +1
        offsets = np.stack([others[rng.choice(vocab - 1, branching - 1, replace=False)] for _ in range(vocab)])
        self.successors = (np.arange(vocab)[:, None] + np.hstack([np.ones((vocab, 1), int), offsets])) % vocab
        self.probs = rng.dirichlet(np.ones(branching), size=vocab)
        self.stationary = self._stationary()
        row_entropy = -(self.probs * np.log(self.probs, where=self.probs > 0, out=np.zeros_like(self.probs))).sum(1)
        self.entropy_rate = float(self.stationary @ row_entropy)
        self.vocab_size, self.floor_ppl = vocab, math.exp(self.entropy_rate)
        self.baseline_ppl = math.exp(entropy(self.stationary))
        self.seed, self.eval_sequences = seed, eval_sequences
        # Inverse-CDF table: row i's cumulative probabilities shifted to [2i, 2i+1]. One
        # searchsorted over all rows then samples every chain at once; the gap between rows
        # means float rounding of 2i + u can never land in a neighbouring row.
        cdf = np.cumsum(self.probs, axis=1)
        cdf[:, -1] = 1.0
        self._cdf = (2 * np.arange(vocab)[:, None] + cdf).ravel()
        self._next2 = 2 * self.successors.ravel()

    def _stationary(self) -> np.ndarray:
        """pi by lazy power iteration: the lazy chain shares pi and is aperiodic, so it converges."""
        vocab = len(self.probs)
        pi = np.full(vocab, 1.0 / vocab)
        for _ in range(100_000):
            nxt = 0.5 * (pi + np.bincount(self.successors.ravel(), (pi[:, None] * self.probs).ravel(), vocab))
            if np.abs(nxt - pi).sum() < 1e-12:
                return nxt / nxt.sum()
            pi = nxt
        raise DataError(f"synthetic chain (vocab={vocab}) did not reach its stationary distribution; raise branching")

    def _sample(self, u: np.ndarray) -> torch.LongTensor:
        """Sequences of the chain from uniforms u [seq_len, batch]: u[0] picks each start from pi, u[t] the t-th
        move."""
        seq_len, batch = u.shape
        out = np.empty((seq_len, batch), np.int64)
        out[0] = 2 * np.minimum(np.searchsorted(np.cumsum(self.stationary), u[0], "right"), self.vocab_size - 1)
        for t in range(1, seq_len):
            out[t] = self._next2[np.searchsorted(self._cdf, out[t - 1] + u[t])]
        return torch.from_numpy(np.ascontiguousarray(out.T // 2))

    def train_batch(self, step: int, rows: range, global_batch: int, seq_len: int) -> torch.LongTensor:
        self._check_rows(rows, global_batch)
        return self._sample(_row_draws(self.seed, step, rows, seq_len).T)

    def eval_set(self, seq_len: int) -> torch.LongTensor:
        return self._sample(_rng(self.seed, _EVAL).random((seq_len, self.eval_sequences)))

    def describe(self) -> dict:
        return {"kind": "synthetic", "vocab": self.vocab_size, "branching": self.successors.shape[1],
                "entropy_rate": self.entropy_rate, "floor_ppl": self.floor_ppl, "baseline_ppl": self.baseline_ppl,
                "eval_sequences": self.eval_sequences}


class TextSource(TokenSource):
    """Local text packed into fixed blocks; the tail blocks are the held-out eval set."""

    def __init__(self, data: TextData, model_vocab: int, seq_len: int, seed: int):
        files = data.files()  # checks the tokenizer directory too
        paths, tokenizer, eval_fraction = data.paths, data.tokenizer, float(data.eval_fraction)
        tok = load_tokenizer(tokenizer)
        if len(tok) > model_vocab:
            raise DataError(f"tokenizer {tokenizer} has {len(tok)} tokens but the model vocab is {model_vocab}")
        docs = [d for f in files for d in documents(f, data.text_key) if d]
        sep = [] if tok.eos_token_id is None else [tok.eos_token_id]
        ids = []
        for doc_ids in tok(docs, add_special_tokens=False, verbose=False)["input_ids"] if docs else []:
            ids += (sep if ids else []) + doc_ids
        n_blocks = len(ids) // seq_len
        if n_blocks < 2:
            raise DataError(f"dataset {', '.join(map(str, paths))} yields {len(ids)} tokens = {n_blocks} "
                            f"blocks of seq_len {seq_len}; need at least 2")
        blocks = torch.tensor(ids[: n_blocks * seq_len], dtype=torch.long).view(n_blocks, seq_len)
        if int(blocks.max()) >= len(tok):
            raise DataError(f"tokenizer {tokenizer} emits id {int(blocks.max())} >= its size {len(tok)}")
        n_eval = max(1, round(eval_fraction * n_blocks))
        if n_eval >= n_blocks:
            raise DataError(f"eval_fraction {eval_fraction} leaves no training block out of {n_blocks}")
        self.train_blocks, self.eval_blocks = blocks[:-n_eval], blocks[-n_eval:]
        self.vocab_size, self.floor_ppl = len(tok), None
        self.baseline_ppl = unigram_ppl(self.eval_blocks, len(tok))
        self.seq_len, self.seed, self.tokenizer, self.n_files = seq_len, seed, tokenizer, len(files)

    def train_batch(self, step: int, rows: range, global_batch: int, seq_len: int) -> torch.LongTensor:
        self._check_len(seq_len)
        self._check_rows(rows, global_batch)
        n = len(self.train_blocks)  # floor(u * n): uniform up to n / 2^53, and one draw a row whatever n is
        idx = np.minimum((_row_draws(self.seed, step, rows, 1)[:, 0] * n).astype(np.int64), n - 1)
        return self.train_blocks[torch.from_numpy(idx)]

    def eval_set(self, seq_len: int) -> torch.LongTensor:
        self._check_len(seq_len)
        return self.eval_blocks.clone()

    def describe(self) -> dict:
        return {"kind": "text", "vocab": self.vocab_size, "floor_ppl": None, "baseline_ppl": self.baseline_ppl,
                "tokenizer": self.tokenizer,
                "files": self.n_files, "seq_len": self.seq_len,
                "train_blocks": len(self.train_blocks), "eval_blocks": len(self.eval_blocks)}


def build_source(data: DataSection | dict, model_vocab: int, seq_len: int, seed: int,
                 global_batch: int | None = None, steps: int | None = None) -> TokenSource:
    """The source a data section names. Its keys and types were checked by train.contract.sections; what needs the
    model's vocabulary (vocab and branching ranges) is checked here, before any process group starts.
    `global_batch` and `steps` let a prepared directory check it can feed the run."""
    if isinstance(data, dict):
        data = data_section(data)
    if not isinstance(seed, int) or seed < 0 or not isinstance(seq_len, int) or seq_len < 1:
        raise DataError(f"seed must be an int >= 0 and seq_len an int >= 1, got seed={seed!r} seq_len={seq_len!r}")
    if isinstance(data, SyntheticData):
        vocab = _in_range("vocab", min(model_vocab, 512) if data.vocab is None else data.vocab, 2, model_vocab)
        return SyntheticSource(vocab, _in_range("branching", data.branching, 1, vocab),
                               _in_range("eval_sequences", data.eval_sequences, 1, 1 << 20), seed)
    if isinstance(data, TokensData):
        return TokensSource(data, model_vocab, seq_len, seed, global_batch, steps)
    return TextSource(data, model_vocab, seq_len, seed)


def for_run(spec, model_vocab: int) -> TokenSource:
    """The source of a run spec (train.contract.spec.RunSpec), checked against its global batch and steps."""
    cfg = spec.train
    return build_source(spec.data, model_vocab, cfg.seq_len, cfg.seed, global_batch(spec), cfg.steps)


def global_batch(spec) -> int:
    """Sequences one step trains over every data-parallel rank of the run."""
    return spec.layout.dp_world * spec.train.batch_per_rank


def rank_rows(spec, data_rank: int) -> range:
    """The rows of each step's global batch that data-parallel rank `data_rank` trains on."""
    b = spec.train.batch_per_rank
    return range(data_rank * b, (data_rank + 1) * b)
