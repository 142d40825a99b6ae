"""RunResult: result.json's one reader and writer, and the schema document generated from it."""
import json
import subprocess
import sys

import pytest

from tests.support import ROOT, make_result
from train.contract.result import PHASES, RankRecord, ResultError, RunResult, Stats, schema_markdown


def test_round_trip_through_json(tmp_path):
    r = make_result(phases={p: Stats(0.1 * i, 0.01, 7) for i, p in enumerate(PHASES)},
                    aggregation_event=Stats(0.5, 0.1, 2),
                    ranks=[RankRecord(0, "h0", "n0", "s1.s2"), RankRecord(1, "h1")])
    r.save(tmp_path / "result.json")
    raw = json.loads((tmp_path / "result.json").read_text())
    assert raw["phases"]["optimizer"] == {"mean": 0.2, "std": 0.01, "n": 7}
    assert raw["ranks"][1] == {"rank": 1, "host": "h1", "node": None, "topology_addr": None}
    assert RunResult.load(tmp_path / "result.json") == r
    assert r.ranks[0].where == "n0" and r.ranks[1].where == "h1"


def test_files_from_before_the_timed_apart_fields_still_load():
    raw = make_result().to_dict()
    for key in ("resumed_from_step", "checkpoint_s", "checkpoints", "logging_s"):
        del raw[key]
    assert RunResult.from_dict(raw).checkpoint_s == 0.0


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(bogus=1), "unknown result key(s): bogus"),
    (lambda d: d.pop("eval_ppl"), "result is missing key(s): eval_ppl"),
    (lambda d: d["phases"].pop("forward"), "result phases must be forward, backward, optimizer, aggregation"),
    (lambda d: d["ranks"].append({"rank": 0}), "result is malformed"),
])
def test_malformed_results_name_the_problem(change, message):
    raw = make_result().to_dict()
    change(raw)
    with pytest.raises(ResultError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunResult.from_dict(raw)


def test_pooled_stats_equal_stats_of_the_union():
    a, b = [1.0, 2.0, 4.0], [3.0, 7.0]
    pooled = Stats.pool([Stats.of(a), Stats.of(b), Stats.of([])])
    union = Stats.of(a + b)
    assert pooled.n == union.n and pooled.mean == pytest.approx(union.mean) and pooled.std == pytest.approx(union.std)


def test_schema_document_is_current():
    doc = (ROOT / "docs" / "result-schema.md").read_text()
    assert doc == schema_markdown(), "regenerate: python -m train.contract.result > docs/result-schema.md"
    out = subprocess.run([sys.executable, "-m", "train.contract.result"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout == doc
    for name in RunResult.__dataclass_fields__:
        assert f"| `{name}` |" in doc


def test_identity_counts_a_missing_train_key_as_its_default():
    """A spec.json written before train.eval_every existed is the same experiment as one leaving it at 0."""
    from train.contract.spec import RunSpec, identity_changes

    spec = RunSpec.from_dict({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "out_dir": "/tmp/x"}).to_dict()
    older = {**spec, "train": {k: v for k, v in spec["train"].items() if k not in ("eval_every", "target_ppl")}}
    assert identity_changes(older, spec) == []
    changed = {**spec, "train": {**spec["train"], "eval_every": 4}}
    assert identity_changes(older, changed) == ["train.eval_every: 0 -> 4"]
