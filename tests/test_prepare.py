"""python -m train.data.prepare: token shards and an index that match the tokenizer, idempotent, resumable, parallel;
and the bad inputs a prepared directory can meet, each one line."""
import json
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import WORDS
from tests.support import ROOT, clean_env, wait_for
from train.contract import token_index
from train.contract.common import DataError
from train.data.prepare import INDEX, prepare


@pytest.fixture
def corpus(tmp_path):
    """a.txt (1 document), sub/b.jsonl (2), sub/c.parquet (2), and a file that is not data."""
    docs = [" ".join(WORDS[i:i + 24]) for i in range(0, 120, 24)]
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text(docs[0])
    (root / "sub" / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[1:3]))
    pq.write_table(pa.table({"text": docs[3:]}), root / "sub" / "c.parquet")
    (root / "notes.md").write_text("not data")
    return root, docs


def _shards(out, index) -> list[np.ndarray]:
    return [np.fromfile(out / r["shard"], dtype=index["dtype"]) for r in index["files"]]


def test_shards_hold_each_documents_ids_then_eos_in_file_order(corpus, tiny_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    root, docs = corpus
    index, said = prepare([str(root)], str(tiny_tokenizer), tmp_path / "out", eval_fraction=0.1)
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    expected = [ids + [tok.eos_token_id] for ids in tok(docs, add_special_tokens=False)["input_ids"]]
    assert [r["documents"] for r in index["files"]] == [1, 2, 2]
    assert [r["path"].split("corpus/")[1] for r in index["files"]] == ["a.txt", "sub/b.jsonl", "sub/c.parquet"]
    assert [s.tolist() for s in _shards(tmp_path / "out", index)] == \
        [expected[0], expected[1] + expected[2], expected[3] + expected[4]]
    assert index["dtype"] == "uint16" and index["tokens"] == sum(map(len, expected)) == 125
    assert index["eval_tokens"] == round(0.1 * 125) and index["tokenizer"]["size"] == len(tok)
    assert said.startswith(f"prepared {tmp_path / 'out'}: 3 shard(s), 5 documents, 125 tokens (uint16)")


def test_a_second_run_does_nothing_and_a_changed_file_alone_is_tokenized_again(corpus, tiny_tokenizer, tmp_path):
    root, docs = corpus
    out = tmp_path / "out"
    first, _ = prepare([str(root)], str(tiny_tokenizer), out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    again, said = prepare([str(root)], str(tiny_tokenizer), out)
    assert again == first and said == f"{out} is up to date: 3 shard(s), 125 tokens; nothing to do"
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == stamps
    (root / "a.txt").write_text(docs[0] + " w1 w2")
    changed, said = prepare([str(root)], str(tiny_tokenizer), out)
    assert "(1 changed or new file(s), 2 reused)" in said and changed["tokens"] == 127
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    assert len(after) == 6 and len(set(after.items()) & set(stamps.items())) == 4  # b and c, shard and record


def test_a_killed_preparation_resumes_without_redoing_finished_shards(corpus, tiny_tokenizer, tmp_path):
    """What a kill leaves: finished shards with their records, one shard written without its record, a
    half-written temporary file, and no index (written last)."""
    root, _ = corpus
    out = tmp_path / "out"
    whole, _ = prepare([str(root)], str(tiny_tokenizer), out)
    (out / INDEX).unlink()
    unfinished = out / whole["files"][1]["shard"]
    unfinished.with_suffix(".json").unlink()
    (out / f".{unfinished.name}.tmp999").write_bytes(b"\x01\x02")
    kept = {r["shard"]: (out / r["shard"]).stat().st_mtime_ns for r in whole["files"]}
    resumed, said = prepare([str(root)], str(tiny_tokenizer), out)
    assert resumed == whole and "prepared" in said
    now = {r["shard"]: (out / r["shard"]).stat().st_mtime_ns for r in whole["files"]}
    assert [now[s] == kept[s] for s in kept] == [True, False, True]
    assert not list(out.glob(".shard-*"))


@pytest.mark.slow
def test_a_preparation_killed_by_sigkill_resumes_and_ends_as_one_never_killed(tiny_tokenizer, tmp_path):
    """A real kill (SIGKILL, once a few shards are recorded): the rerun keeps those shards untouched, tokenizes
    the rest, and its index and shards are those of a preparation that was never killed."""
    root = tmp_path / "corpus"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):  # ~25 ms of tokenizing each: the kill lands mid-run
        docs = (" ".join(rng.choice(WORDS, 40)) for _ in range(1500))
        (root / f"f{i:02d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    run = [sys.executable, "-m", "train.data.prepare", str(root), "--tokenizer", str(tiny_tokenizer), "--workers", "1",
           "--out"]
    out = tmp_path / "out"
    proc = subprocess.Popen([*run, str(out)], cwd=ROOT, env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(list(out.glob("shard-*.json"))) >= 2, "two finished shards", timeout_s=120,
                 alive=lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    records = sum(name.endswith(".json") for name in finished)
    assert not (out / INDEX).exists() and 2 <= records < 40
    proc = subprocess.run([*run, str(out)], capture_output=True, text=True, cwd=ROOT, env=clean_env())
    assert proc.returncode == 0 and f"({records} shard(s) reused from an interrupted run)" in proc.stdout, proc.stderr
    assert all(out.joinpath(name).stat().st_mtime_ns == stamp for name, stamp in finished.items()
               if name.endswith(".json"))
    clean, _ = prepare([str(root)], str(tiny_tokenizer), tmp_path / "clean")
    assert json.loads((out / INDEX).read_text()) == clean
    assert all((out / r["shard"]).read_bytes() == (tmp_path / "clean" / r["shard"]).read_bytes()
               for r in clean["files"])
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "clean").iterdir())


@pytest.mark.slow
def test_the_launcher_prepares_as_one_job_and_a_rerun_does_nothing(corpus, tiny_tokenizer, tmp_path):
    """action=prepare on cluster=local: a submitit job runs train.data.prepare; the same command again is a no-op, and
    an error inside the job comes back as one line."""
    root, _ = corpus

    def launch(out, sources):
        return subprocess.run([sys.executable, "-m", "launcher", "action=prepare", "data=tokens", f"data.path={out}",
                               f"data.tokenizer={tiny_tokenizer}", f"prepare.sources=[{sources}]",
                               f"results_dir={tmp_path / 'res'}", "prepare.workers=1", "poll_s=0.2"],
                              capture_output=True, text=True, cwd=ROOT, env=clean_env())

    first = launch(tmp_path / "out", root)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    assert lines[0].startswith("submitted the preparation of ") and lines[0].endswith("(1 worker(s))")
    assert lines[-1].startswith(f"prepared {tmp_path / 'out'}: 3 shard(s), 5 documents, 125 tokens (uint16)")
    direct, _ = prepare([str(root)], str(tiny_tokenizer), tmp_path / "direct")
    assert json.loads((tmp_path / "out" / INDEX).read_text())["files"] == direct["files"]
    again = launch(tmp_path / "out", root)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == \
        f"{tmp_path / 'out'} is up to date: 3 shard(s), 125 tokens; nothing to do", again.stderr
    assert (tmp_path / "res" / "local" / "prepare" / "out" / "submitit").is_dir()
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    empty = launch(tmp_path / "none", blank)
    assert empty.returncode == 1 and re.fullmatch(
        rf"fedshard: error: preparation job \d+ failed: train.contract.common.DataError: the corpus {blank} holds "
        r"no text: "
        r"nothing to train on; logs in \S+\n", empty.stderr), empty.stderr


def test_two_workers_write_what_one_writes(corpus, tiny_tokenizer, tmp_path):
    root, _ = corpus
    one, _ = prepare([str(root)], str(tiny_tokenizer), tmp_path / "one", workers=1)
    two, _ = prepare([str(root)], str(tiny_tokenizer), tmp_path / "two", workers=2)
    assert one == two
    assert [s.tolist() for s in _shards(tmp_path / "one", one)] == [s.tolist() for s in _shards(tmp_path / "two", two)]


def _other_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(f"v{i}" for i in range(70000))],
                            trainers.WordLevelTrainer(vocab_size=80_000, special_tokens=["[UNK]", "[EOS]"]))
    path = tmp_path / "big-tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="[EOS]", unk_token="[UNK]").save_pretrained(path)
    return path


def test_another_tokenizer_is_refused_naming_both_hashes(corpus, tiny_tokenizer, tmp_path):
    root, _ = corpus
    index, _ = prepare([str(root)], str(tiny_tokenizer), tmp_path / "out")
    other = _other_tokenizer(tmp_path)
    mine = index["tokenizer"]["hash"]
    with pytest.raises(DataError, match=f"prepared with tokenizer {mine} .* not [0-9a-f]{{32}} .*another directory"):
        prepare([str(root)], str(other), tmp_path / "out")
    with pytest.raises(DataError, match=rf"data.tokenizer .*big-tok \(hash [0-9a-f]{{32}}\) is not the tokenizer "
                                        rf".* \(.*, hash {mine}\)"):
        token_index.load(str(tmp_path / "out"), str(other))
    big, _ = prepare([str(root)], str(other), tmp_path / "big")  # 70,000 words: no longer fits uint16
    assert big["dtype"] == "uint32"


def test_a_truncated_or_missing_shard_is_named_with_its_expected_size(corpus, tiny_tokenizer, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    index, _ = prepare([str(root)], str(tiny_tokenizer), out)
    shard = out / index["files"][2]["shard"]
    shard.write_bytes(shard.read_bytes()[:-2])
    expected = index["files"][2]["tokens"] * 2
    with pytest.raises(DataError, match=f"shard {shard} is truncated \\({expected - 2} bytes\\): expected "
                                        f"{expected} bytes"):
        token_index.load(str(out))
    shard.unlink()
    with pytest.raises(DataError, match=f"shard {shard} is missing: expected {expected} bytes"):
        token_index.load(str(out))


def test_runs_the_directory_cannot_feed_are_refused(corpus, tiny_tokenizer, tmp_path):
    root, _ = corpus
    out = tmp_path / "out"
    index, _ = prepare([str(root)], str(tiny_tokenizer), out, eval_fraction=0.1)  # 125 tokens, 12 held out
    token_index.check_run(index, str(out), 512, 8, 14, 1, epochs=1)  # 113 // 8 = 14 blocks: one batch of 14
    with pytest.raises(DataError, match="a vocabulary of 122 but the model has 100 embeddings"):
        token_index.check_run(index, str(out), 100, 8, 4, 1, None)
    with pytest.raises(DataError, match="holds 14 training block\\(s\\) of seq_len 8, fewer than one global batch "
                                        "of 15 sequences"):
        token_index.check_run(index, str(out), 512, 8, 15, 1, None)
    with pytest.raises(DataError, match="holds out 12 tokens, not one block of seq_len 16"):
        token_index.check_run(index, str(out), 512, 16, 2, 1, None)
    with pytest.raises(DataError, match="data.epochs=2 .* \\(14 blocks of 8 tokens\\) takes 4 steps of 7 "
                                        "sequences, but train.steps=1"):
        token_index.check_run(index, str(out), 512, 8, 7, 1, epochs=2)


def test_cli_prepares_then_refuses_an_empty_corpus_in_one_line(corpus, tiny_tokenizer, tmp_path):
    root, _ = corpus
    run = [sys.executable, "-m", "train.data.prepare", "--tokenizer", str(tiny_tokenizer), "--workers", "1"]
    proc = subprocess.run([*run, str(root), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          cwd=ROOT, env=clean_env())
    assert proc.returncode == 0 and proc.stdout.startswith("prepared "), proc.stderr
    assert "prepare: 100.0% of " in proc.stderr and "5 documents, 125 tokens" in proc.stderr  # the progress line
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    proc = subprocess.run([*run, str(empty), "--out", str(tmp_path / "none")], capture_output=True, text=True,
                          cwd=ROOT, env=clean_env())
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == \
        f"fedshard: error: the corpus {empty} holds no text: nothing to train on"
    assert not (tmp_path / "none" / INDEX).exists()


def test_the_launcher_relays_the_jobs_latest_progress_line(tmp_path):
    from types import SimpleNamespace

    from launcher.actions.prepare import last_progress
    from train.contract import submitit_compat

    job = SimpleNamespace(paths=SimpleNamespace(folder=tmp_path), job_id="7")
    assert last_progress(job) is None  # no log yet
    log = submitit_compat.task_paths(tmp_path, "7", 0).stderr
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("submitit INFO starting\nprepare:  10.0% of 5.0 MB, ...\nprepare:  60.0% of 5.0 MB, ...\n"
                   "some warning\n")
    assert last_progress(job) == "prepare:  60.0% of 5.0 MB, ..."
