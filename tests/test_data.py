"""Data sources: the synthetic floor is exact, batches are pure functions, text packs correctly."""
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import WORDS
from train.contract.common import DataError
from train.data.sources import build_source


def synthetic(vocab=64, branching=8, seed=0, **extra):
    return build_source({"kind": "synthetic", "vocab": vocab, "branching": branching, **extra}, 1000, 32, seed)


def dense(src):
    P = np.zeros((src.vocab_size, src.vocab_size))
    np.add.at(P, (np.arange(src.vocab_size)[:, None], src.successors), src.probs)
    return P


# ---------------------------------------------------------------- synthetic

@pytest.mark.parametrize("seed,branching", [(0, 3), (1, 2), (2, 6), (3, 1)])
def test_floor_ppl_matches_brute_force(seed, branching):
    src = synthetic(vocab=6, branching=branching, seed=seed)
    P = dense(src)
    assert np.allclose(P.sum(1), 1) and (P[np.arange(6), (np.arange(6) + 1) % 6] > 0).all()
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1))])
    pi /= pi.sum()
    logP = np.log(P, where=P > 0, out=np.zeros_like(P))
    H = -(pi[:, None] * P * logP).sum()
    assert src.floor_ppl == pytest.approx(math.exp(H), rel=1e-9)
    assert np.allclose(src.stationary, pi, atol=1e-9)


def test_empirical_cross_entropy_and_token_frequencies_match_the_chain():
    src = synthetic(vocab=64, branching=8, seed=5)
    x = src.train_batch(0, range(64), 64, 512).numpy()
    logP = np.log(dense(src), where=dense(src) > 0, out=np.full((64, 64), -np.inf))
    nll = -logP[x[:, :-1], x[:, 1:]]
    assert np.isfinite(nll).all()  # every transition is one the chain allows
    assert nll.mean() == pytest.approx(math.log(src.floor_ppl), rel=0.02)
    freq = np.bincount(x.ravel(), minlength=64) / x.size
    assert 0.5 * np.abs(freq - src.stationary).sum() < 0.05
    first = np.bincount(src.train_batch(1, range(4096), 4096, 1).numpy().ravel(), minlength=64) / 4096
    assert 0.5 * np.abs(first - src.stationary).sum() < 0.1  # sequences start from pi


def test_baseline_ppl_is_the_unigram_cross_entropy_of_the_eval_set():
    """The closed form exp(H(pi)) is what a context-free model scores on the eval set (measured on a big one),
    and the chain's context brings the floor well below it."""
    src = synthetic(vocab=64, branching=8, seed=5, eval_sequences=512)
    assert src.baseline_ppl == pytest.approx(math.exp(-(src.stationary * np.log(src.stationary)).sum()), rel=1e-12)
    predicted = src.eval_set(32)[:, 1:].numpy().ravel()  # what eval perplexity scores (labels shift by one)
    unigram_nll = -np.log(src.stationary[predicted]).mean()
    assert unigram_nll == pytest.approx(math.log(src.baseline_ppl), rel=0.01)
    assert src.floor_ppl < 0.5 * src.baseline_ppl and src.describe()["baseline_ppl"] == src.baseline_ppl


def test_synthetic_batches_are_pure_functions_of_seed_step_and_row():
    a, b = synthetic(seed=7), synthetic(seed=7)
    x = a.train_batch(11, range(12, 16), 16, 32)
    assert x.dtype == torch.long and x.shape == (4, 32)
    assert torch.equal(x, a.train_batch(11, range(12, 16), 16, 32))
    assert torch.equal(x, b.train_batch(11, range(12, 16), 16, 32))
    assert not torch.equal(x, a.train_batch(11, range(16, 20), 20, 32))
    assert not torch.equal(x, a.train_batch(12, range(12, 16), 16, 32))
    assert not torch.equal(x, synthetic(seed=8).train_batch(11, range(12, 16), 16, 32))
    assert 0 <= int(x.min()) and int(x.max()) < a.vocab_size


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_a_step_s_sequences_are_the_same_however_the_global_batch_is_sliced(kind, corpus, tiny_tokenizer):
    """Issue 41: 8 data-parallel ranks of 1 sequence, 4 of 2, 2 of 4 or one of 8 train on the same 8 sequences, row
    for row, so layouts of different tp, pp or data-parallel degree see the same data."""
    src = synthetic(seed=3) if kind == "synthetic" else text([corpus[0]], tiny_tokenizer)
    seq = 32 if kind == "synthetic" else 10
    for step in (0, 5):
        whole = src.train_batch(step, range(8), 8, seq)
        assert len({tuple(r) for r in whole.tolist()}) > 1  # rows differ: each is drawn on its own
        for ranks in (2, 4, 8):
            b = 8 // ranks
            sliced = torch.cat([src.train_batch(step, range(d * b, (d + 1) * b), 8, seq) for d in range(ranks)])
            assert torch.equal(sliced, whole)
    assert not torch.equal(src.train_batch(1, range(8), 8, seq), src.train_batch(0, range(8), 8, seq))
    with pytest.raises(DataError, match="not a slice of a global batch of 8"):
        src.train_batch(0, range(6, 10), 8, seq)


def test_synthetic_eval_set_is_fixed_and_separate_from_training_streams():
    src = synthetic(eval_sequences=16)
    ev = src.eval_set(32)
    assert ev.shape == (16, 32) and torch.equal(ev, src.eval_set(32))
    assert torch.equal(ev, synthetic(eval_sequences=16).eval_set(32))
    for d in range(4):
        assert not torch.equal(ev, src.train_batch(0, range(16 * d, 16 * d + 16), 64, 32))
    assert 0 <= int(ev.min()) and int(ev.max()) < src.vocab_size


def test_synthetic_defaults_and_describe():
    src = build_source({"kind": "synthetic"}, 100, 16, 0)
    assert src.vocab_size == 100 and src.successors.shape == (100, 8)
    assert build_source({"kind": "synthetic"}, 50_000, 16, 0).vocab_size == 512
    d = json.loads(json.dumps(src.describe()))
    assert d["kind"] == "synthetic" and d["vocab"] == 100 and d["floor_ppl"] == src.floor_ppl


@pytest.mark.parametrize("data,needle", [
    ({"kind": "synthetic", "vocab": 2000}, "vocab"),
    ({"kind": "synthetic", "vocab": 1}, "vocab"),
    ({"kind": "synthetic", "vocab": 16, "branching": 0}, "branching"),
    ({"kind": "synthetic", "vocab": 16, "branching": 17}, "branching"),
    ({"kind": "synthetic", "eval_sequences": 0}, "eval_sequences"),
    ({"kind": "synthetic", "vocab": True}, "vocab"),
    ({"kind": "synthetic", "vocabulary": 8, "zzz": 1}, "vocabulary, zzz"),
    ({"kind": "markov"}, "markov"),
    ({"vocab": 8}, "kind"),
])
def test_synthetic_bad_specs(data, needle):
    with pytest.raises(DataError, match=needle):
        build_source(data, 1000, 32, 0)


# ---------------------------------------------------------------- text

@pytest.fixture
def corpus(tmp_path):
    """a.txt (1 doc), sub/b.jsonl (2 docs), sub/c.parquet (2 docs) plus a file that must be ignored."""
    docs = [" ".join(WORDS[i:i + 24]) for i in range(0, 120, 24)]
    (tmp_path / "a.txt").write_text(docs[0])
    (tmp_path / "sub").mkdir()
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs[1:3])]
    (tmp_path / "sub" / "b.jsonl").write_text("\n".join(lines) + "\n\n")
    pq.write_table(pa.table({"text": docs[3:]}), tmp_path / "sub" / "c.parquet")
    (tmp_path / "notes.md").write_text("not data")
    return tmp_path, docs


def text(paths, tiny_tokenizer, seq_len=10, model_vocab=1000, **extra):
    spec = {"kind": "text", "paths": [str(p) for p in paths], "tokenizer": str(tiny_tokenizer), **extra}
    return build_source(spec, model_vocab, seq_len, 0)


def test_text_packs_documents_with_eos_and_holds_out_the_tail(corpus, tiny_tokenizer):
    from transformers import AutoTokenizer

    root, docs = corpus
    src = text([root], tiny_tokenizer, eval_fraction=0.25)
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    ids = tok(docs[0], add_special_tokens=False)["input_ids"]
    for d in docs[1:]:
        ids += [tok.eos_token_id] + tok(d, add_special_tokens=False)["input_ids"]
    assert len(ids) == 124 and src.vocab_size == len(tok) and src.floor_ppl is None
    blocks = torch.tensor(ids[:120]).view(12, 10)  # tail of 4 tokens dropped
    assert torch.equal(torch.cat([src.train_blocks, src.eval_blocks]), blocks)
    assert torch.equal(src.eval_set(10), blocks[9:])  # round(0.25 * 12) = 3 held out
    assert tok.decode(src.eval_set(10)[-1]) == " ".join(WORDS[106:116])  # 4 EOS precede it
    seen = set()
    for step in range(4):
        for row in src.train_batch(step, range(16), 16, 10):
            match = (blocks == row).all(1).nonzero().flatten().tolist()
            assert len(match) == 1 and match[0] < 9
            seen.add(match[0])
    assert seen == set(range(9))  # with replacement, but every train block is reachable
    d = json.loads(json.dumps(src.describe()))
    assert d["train_blocks"] == 9 and d["eval_blocks"] == 3 and d["files"] == 3
    # baseline: the eval blocks' own unigram frequencies over the tokens eval perplexity scores, counted
    scored = blocks[9:, 1:].reshape(-1).tolist()
    p = [scored.count(t) / len(scored) for t in set(scored)]
    assert src.baseline_ppl == pytest.approx(math.exp(-sum(q * math.log(q) for q in p)), rel=1e-12)
    assert d["baseline_ppl"] == src.baseline_ppl


def test_text_batches_are_deterministic_per_step_and_row(corpus, tiny_tokenizer):
    root, _ = corpus
    a, b = text([root], tiny_tokenizer), text([root / "a.txt", root / "sub"], tiny_tokenizer)
    assert torch.equal(a.train_batch(2, range(8, 16), 16, 10), b.train_batch(2, range(8, 16), 16, 10))
    assert not torch.equal(a.train_batch(2, range(8, 16), 16, 10), a.train_batch(2, range(16, 24), 24, 10))
    assert not torch.equal(a.train_batch(2, range(8, 16), 16, 10), a.train_batch(3, range(8, 16), 16, 10))
    assert len(a.eval_set(10)) == 1  # default eval_fraction 0.01 still holds out one block
    with pytest.raises(DataError, match="seq_len 10"):
        a.train_batch(0, range(2), 2, 12)


def test_text_errors_name_the_offending_path_or_key(corpus, tiny_tokenizer, tmp_path_factory):
    root, _ = corpus
    bad = tmp_path_factory.mktemp("bad")

    def raises(needle, paths, tok=tiny_tokenizer, **kw):
        with pytest.raises(DataError) as e:
            text(paths, tok, **kw)
        assert needle in str(e.value) and "\n" not in str(e.value)

    raises(str(bad / "no_tok"), [root], tok=bad / "no_tok")
    (bad / "empty_tok").mkdir()
    raises(str(bad / "empty_tok"), [root], tok=bad / "empty_tok")
    raises("122 tokens but the model vocab is 121", [root], model_vocab=121)
    raises(str(bad / "missing.txt"), [root, bad / "missing.txt"])
    (bad / "only_md").mkdir()
    (bad / "only_md" / "x.md").write_text("w1 w2")
    raises(str(bad / "only_md"), [bad / "only_md"])
    raises(str(bad / "only_md" / "x.md"), [bad / "only_md" / "x.md"])
    (bad / "bad.jsonl").write_text('{"text": "w1"}\n{not json\n')
    raises(f"{bad / 'bad.jsonl'}:2", [bad / "bad.jsonl"])
    (bad / "nokey.jsonl").write_text('{"text": "w1"}\n\n{"body": "w2"}\n')
    raises(f"{bad / 'nokey.jsonl'}:3: no string field 'text'", [bad / "nokey.jsonl"])
    pq.write_table(pa.table({"body": ["w1 w2"]}), bad / "t.parquet")
    raises(f"{bad / 't.parquet'}: no column 'content'", [bad / "t.parquet"], text_key="content")
    (bad / "empty.txt").write_text("")
    raises(str(bad / "empty.txt"), [bad / "empty.txt"])
    (bad / "short.txt").write_text(" ".join(WORDS[:15]))
    raises("1 blocks", [bad / "short.txt"])
    raises("eval_fraction", [root], eval_fraction=1.0)
    raises("no training block", [bad / "short.txt"], seq_len=5, eval_fraction=0.9)
    raises("bogus, extra", [root], bogus=1, extra=2)


def test_parquet_without_pyarrow_is_named_before_anything_runs(tmp_path, monkeypatch):
    """pyarrow is the `parquet` extra: without it a .parquet path is one line naming the extra."""
    import importlib.util

    from train.contract.sections import data_section

    (tmp_path / "tok").mkdir()
    pq.write_table(pa.table({"text": ["w1 w2"]}), tmp_path / "a.parquet")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    section = data_section({"kind": "text", "paths": [str(tmp_path)], "tokenizer": str(tmp_path / "tok")})
    with pytest.raises(DataError, match=r"a.parquet needs pyarrow, which is not installed: .*'fedshard\[parquet\]'"):
        section.files()
