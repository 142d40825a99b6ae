"""data=tokens: memory-mapped shards drawn without replacement. Every training block exactly once per epoch,
disjoint across ranks and federation groups, under the four strategies and across a resume, collected from
the batches the ranks really trained on."""
import json

import numpy as np
import pytest
import torch

from tests.conftest import WORDS
from tests.support import run_ranks
from train.contract.sections import TokensData
from train.data.prepare import prepare
from train.data.tokens import TokensSource

SEQ, BATCH, RANKS = 16, 2, 4


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_tokenizer):
    """Three files of 40 documents of 8 to 29 words; 48 training blocks of 16 tokens (and a few held out)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for f in range(3):
        docs = [" ".join(rng.choice(WORDS, size=rng.integers(8, 30))) for _ in range(40)]
        (root / f"part{f}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = root.parent / f"{root.name}-tokens"
    prepare([str(root)], str(tiny_tokenizer), out, eval_fraction=0.05)
    return out


def _source(path, seed=0) -> TokensSource:
    return TokensSource(TokensData(path=str(path)), 512, SEQ, seed)


def test_blocks_are_the_prepared_tokens_in_order_and_each_epoch_draws_each_once(prepared):
    source = _source(prepared)
    index = source.index
    tokens = np.concatenate([np.fromfile(prepared / r["shard"], dtype=index["dtype"]) for r in index["files"]])
    n = source.n_train
    per_step = RANKS * BATCH
    drawn = [source.block_indices(t, range(s * BATCH, (s + 1) * BATCH), per_step) for t in range(2 * n // per_step)
             for s in range(RANKS)]
    epochs = {}
    for epoch, block in (d for batch in drawn for d in batch):
        epochs.setdefault(epoch, []).append(block)
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(n)) and epochs[0] != epochs[1]
    rows = range(BATCH, 2 * BATCH)  # data-parallel rank 1's
    batch = source.train_batch(3, rows, per_step, SEQ)
    assert torch.equal(batch, source.train_batch(3, range(per_step), per_step, SEQ)[BATCH:2 * BATCH])
    for row, (_, block) in zip(batch.tolist(), source.block_indices(3, rows, per_step)):
        assert row == tokens[block * SEQ:(block + 1) * SEQ].tolist()  # blocks may span two shards
    assert source.eval_set(SEQ).tolist() == tokens[index["tokens"] - index["eval_tokens"]:][
        :source.n_eval * SEQ].reshape(-1, SEQ).tolist()
    assert _source(prepared, seed=1).block_indices(0, range(BATCH), per_step) != source.block_indices(
        0, range(BATCH), per_step)


def _train_with_a_resume(rank, world, spec_dict, stop_at):
    """Steps [0, stop_at), a checkpoint, then a new Trainer that restores it and runs to the end; every
    (epoch, block) this rank trained on, and rank 0's result."""
    from pathlib import Path

    from train.contract.spec import RunSpec
    from train.loop import Trainer

    spec = RunSpec.from_dict(spec_dict)
    seen = []

    def recording(trainer):
        draw = trainer.source.train_batch

        def train_batch(step, rows, global_batch, seq_len):
            seen.extend(trainer.source.block_indices(step, rows, global_batch))
            return draw(step, rows, global_batch, seq_len)
        trainer.source.train_batch = train_batch
        return trainer

    first = recording(Trainer(spec, rank, "cpu", out_dir=Path(spec.out_dir)))
    first.restore()
    for i in range(stop_at):
        first.step(i)
    first.checkpointer.save(first.model, first.optimizer, first.state, first.fedavg)
    result = recording(Trainer(spec, rank, "cpu", out_dir=Path(spec.out_dir))).run("gloo")
    return seen, result


@pytest.mark.parametrize("strategy,F,R,S,A", [("fsdp", 1, 1, 4, None), ("hsdp", 1, 2, 2, None),
                                              ("fl_fsdp", 2, 1, 2, 2), ("fl_hsdp", 2, 2, 1, 2)])
@pytest.mark.slow
def test_one_epoch_under_each_strategy_trains_every_block_exactly_once_across_a_resume(prepared, tmp_path, strategy,
                                                                                         F, R, S, A):
    steps = _source(prepared).n_train // (RANKS * BATCH)
    spec = {"strategy": strategy, "F": F, "R": R, "S": S, "A": A, "out_dir": str(tmp_path / "run"),
            "model": {"preset": "tiny"}, "data": {"kind": "tokens", "path": str(prepared), "epochs": 1},
            "train": {"steps": steps, "seq_len": SEQ, "batch_per_rank": BATCH, "log_every": 2}}
    out = run_ranks(_train_with_a_resume, RANKS, spec, 2)
    drawn = [d for seen, _ in out for d in seen]
    n = _source(prepared).n_train  # a last partial global batch (n mod 8 blocks) is not trained
    assert len(set(drawn)) == len(drawn) == steps * RANKS * BATCH and n - len(drawn) < RANKS * BATCH
    assert {epoch for epoch, _ in drawn} == {0} and {b for _, b in drawn} <= set(range(n))
    result = out[0][1]
    assert result.resumed_from_step == 2 and result.data["kind"] == "tokens"
    assert (result.data["epochs"], result.data["blocks_seen"]) == (len(drawn) / n, len(drawn))
