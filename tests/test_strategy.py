"""The strategy table (train/contract/layout.py): each row's rules reproduce the paper's layouts, and the launcher
reads a strategy only through its row, so a row added to the table is swept, planned, ranked and labelled with no other
change."""
import json

import pytest

from launcher.placement import ranking
from launcher.report import paper
from launcher.settings import compose
from launcher.sweep import expand
from train.contract.layout import STRATEGIES, Layout, Strategy
from train.contract.spec import RunSpec


def test_the_paper_layouts_on_128_nodes_of_4_gpus():
    grids = {name: row.grid(128, 4, 16) for name, row in STRATEGIES.items()}
    assert grids == {name: layout for name, layout in paper.LAYOUTS.items()}
    assert [row.label for row in STRATEGIES.values()] == ["FSDP", "HSDP", "FL+FSDP", "FL+HSDP"]
    with pytest.raises(ValueError, match="F=3 federation groups must be >= 2 and divide the 128 nodes"):
        STRATEGIES["fl_hsdp"].grid(128, 4, 3)


def test_candidates_and_accepted_layouts():
    assert ranking.candidates(4, 2, As=(8,)) == [
        Layout("fsdp", 1, 1, 8), Layout("hsdp", 1, 4, 2), Layout("fl_fsdp", 4, 1, 2, 8), Layout("fl_hsdp", 2, 2, 2, 8)]
    assert ranking.candidates(1, 4, As=(8,)) == [Layout("fsdp", 1, 1, 4)]  # one node: nothing to replicate
    assert STRATEGIES["fsdp"].accepts(1, 2) == "fsdp needs F = 1 and R = 1"
    assert STRATEGIES["hsdp"].accepts(2, 2) == "hsdp needs F = 1 (use fl_hsdp for federation groups)"
    assert STRATEGIES["fl_fsdp"].accepts(2, 2) == "fl_fsdp needs R = 1 (use fl_hsdp for replicas)"
    assert STRATEGIES["fl_hsdp"].accepts(2, 2) is None
    assert [row.mesh_dims for row in STRATEGIES.values()] == [("shard",), ("replicate", "shard")] * 2


def test_a_row_added_to_the_table_is_swept_specified_ranked_and_labelled(monkeypatch, tmp_path):
    row = Strategy("diloco_hsdp", "DiLoCo+HSDP", federated=True, replicated=True)
    monkeypatch.setitem(STRATEGIES, row.name, row)
    monkeypatch.setitem(paper.NAMES, row.name, row.label)  # the report's names are read from the table at import
    runs = expand(compose(["sweep=smoke", "sweep.strategies=[fsdp,diloco_hsdp]", "sweep.F=[2]", "sweep.A=[4]",
                           "sweep.nodes=[all]", f"results_dir={tmp_path}"]))
    assert [r.run_id for r in runs] == ["fsdp-F1-R1-S8", "diloco_hsdp-F2-R2-S2-A4"]
    spec = runs[1].spec
    assert spec.federated and RunSpec.from_dict(spec.to_dict()).layout.strategy == "diloco_hsdp"
    assert Layout("diloco_hsdp", 2, 2, 2, 8) in ranking.candidates(4, 2, As=(8,))


def _rank_with_row(rank: int, world: int, row: dict, raw: dict):
    """One rank of a run whose strategy is a row this process's table lacks (the forkserver's children are not the
    test's process): registered first, then trained as any run."""
    from tests.support import _uninterrupted_rank

    STRATEGIES[row["name"]] = Strategy(**row)
    return _uninterrupted_rank(rank, world, raw)


@pytest.mark.slow
def test_a_fifth_row_is_planned_run_and_reported_with_no_other_change(monkeypatch, tmp_path, capsys):
    """DiLoCo over HSDP groups as a strategy of its own: one table row fixing the outer step. The launcher plans it
    (layout, prediction), its runs train on real gloo ranks (registering the row there first, as a plugin would),
    trained exactly as fl_hsdp with train.outer=diloco, and the report labels it."""
    from launcher.__main__ import main
    from tests.support import run_ranks, uninterrupted

    fields = dict(name="diloco_hsdp", label="DiLoCo+HSDP", federated=True, replicated=True, exchange="diloco")
    monkeypatch.setitem(STRATEGIES, "diloco_hsdp", Strategy(**fields))
    monkeypatch.setitem(paper.NAMES, "diloco_hsdp", "DiLoCo+HSDP")
    sweep = ["sweep=smoke", "sweep.strategies=[fl_hsdp,diloco_hsdp]", "sweep.F=[2]", "sweep.A=[2]",
             "sweep.nodes=[all]", f"results_dir={tmp_path}"]
    assert main([*sweep, "action=plan"]) == 0
    plan = json.loads((tmp_path / "local" / "smoke" / "plan.json").read_text())
    planned = {r["run_id"]: r for r in plan["runs"]}
    assert set(planned) == {"fl_hsdp-F2-R2-S2-A2", "diloco_hsdp-F2-R2-S2-A2"}
    assert planned["diloco_hsdp-F2-R2-S2-A2"]["predicted_step_s"] > 0
    runs, results = {run.spec.layout.strategy: run for run in expand(compose(sweep))}, {}
    for run in runs.values():
        raw = run.spec.to_dict()
        results[run.run_id] = run_ranks(_rank_with_row, run.spec.world_size, fields, raw)[0]
        assert raw["train"]["outer"] == ("diloco" if run.spec.layout.strategy == "diloco_hsdp" else "fedavg")
    as_diloco = {**runs["fl_hsdp"].spec.to_dict(), "out_dir": str(tmp_path / "fl_hsdp_diloco")}
    as_diloco["train"]["outer"] = "diloco"
    reference = uninterrupted(as_diloco)
    row_run, fedavg_run = results["diloco_hsdp-F2-R2-S2-A2"], results["fl_hsdp-F2-R2-S2-A2"]
    assert (row_run.train_ppl, row_run.eval_ppl) == (reference.train_ppl, reference.eval_ppl)
    assert row_run.eval_ppl != fedavg_run.eval_ppl  # the row's exchange, not train.outer's fedavg
    capsys.readouterr()
    assert main([*sweep, "action=report"]) == 0
    table = (tmp_path / "local" / "smoke" / "table3.md").read_text()
    assert "DiLoCo+HSDP" in table and "FL+HSDP" in table
