"""Shared fixtures: a word-level tokenizer saved to a local directory (nothing is downloaded).

Hypothesis runs without its per-example deadline: a timing limit would make tests fail on a busy machine.
"""
import pytest
from hypothesis import settings

import tests.forked  # noqa: F401 -- before any forkserver starts: it preloads what tests/forked.py runs too

settings.register_profile("fedshard", deadline=None)
settings.load_profile("fedshard")

WORDS = [f"w{i}" for i in range(120)]  # every word once, so every packed block is unique


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    path = tmp_path_factory.mktemp("tok") / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]").save_pretrained(path)
    return path
