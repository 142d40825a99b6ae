"""The strategy table (train/parallel/strategy.py): each row's rules reproduce the paper's layouts, and the launcher
reads a strategy only through its row, so a row added to the table is swept, planned, ranked and labelled with no other
change."""
import pytest

from launcher.placement import ranking
from launcher.report import paper
from launcher.settings import compose
from launcher.sweep import expand
from train.parallel.strategy import STRATEGIES, Layout, Strategy
from train.spec import RunSpec


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
    assert spec.federated and RunSpec.from_dict(spec.to_dict()).strategy == "diloco_hsdp"
    assert Layout("diloco_hsdp", 2, 2, 2, 8) in ranking.candidates(4, 2, As=(8,))
