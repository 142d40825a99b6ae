"""retry_shrink without a cluster: the largest layout the nodes left hold, the refusals, the manifest's record
read back by a later invocation, and the tables' flag. The node loss itself runs on the testbed
(tests/test_testbed.py)."""
import pytest

from launcher import shrink
from launcher.actions.plan import plan
from launcher.actions.run import Sweeper
from launcher.records.store import Store
from launcher.report.tables import table3
from launcher.settings import compose
from launcher.sweep import expand
from tests.support import make_result

G = 2


def _runs(tmp_path, *overrides):
    settings = compose(["sweep.nodes=[4]", "sweep.F=[2]", "sweep.strategies=[fsdp,hsdp,fl_fsdp,fl_hsdp]",
                        "train.checkpoint_every=5", f"results_dir={tmp_path}", *overrides])
    return settings, {r.spec.layout.strategy: r for r in expand(settings)}


def test_the_largest_layout_of_each_strategy_on_the_nodes_left(tmp_path):
    _, runs = _runs(tmp_path)
    assert shrink.layout_on(runs["fsdp"].spec, 3, G).shape[:3] == (1, 1, 6)     # shards over every rank left
    assert shrink.layout_on(runs["hsdp"].spec, 3, G).shape[:3] == (1, 3, 2)     # one replica per node left
    assert shrink.layout_on(runs["fl_fsdp"].spec, 3, G).shape[:3] == (3, 1, 2)  # one federation group dropped
    with pytest.raises(shrink.ShrinkError, match=r"fl_hsdp-F2-R2-S2-A2: the 3 usable node\(s\) left hold 1 "
                                                 r"federation group\(s\) of 4 ranks, and an FL run cannot shrink "
                                                 r"below F=2; not resubmitted"):
        shrink.layout_on(runs["fl_hsdp"].spec, 3, G)
    with pytest.raises(shrink.ShrinkError, match="no usable node is left"):
        shrink.layout_on(runs["fsdp"].spec, 0, G)


def test_groups_smaller_than_a_node_shrink_by_whole_nodes(tmp_path):
    _, runs = _runs(tmp_path)
    small = shrink.resized(runs["fl_fsdp"], runs["fl_fsdp"].spec.layout.regrid(8, 1, 1), G, "")  # two groups a node
    assert shrink.layout_on(small.spec, 3, G).shape[:3] == (6, 1, 1)
    assert shrink.resized(small, small.spec.layout.regrid(6, 1, 1), G, "").nodes == 3


def test_a_shrunk_run_keeps_its_id_and_directory_and_resumes_elastically(tmp_path):
    _, runs = _runs(tmp_path)
    run = runs["fl_fsdp"]
    to = shrink.resized(run, run.spec.layout.regrid(3, 1, 2), G, "lost node4")
    assert (to.run_id, to.spec.out_dir, to.nodes, to.spec.layout.F, to.spec.train.elastic) == \
        (run.run_id, run.spec.out_dir, 3, 3, True)
    assert not run.spec.train.elastic  # the planned run is left as it was
    assert shrink.change(run, to, 1, ["node4"]) == {"attempt": 1, "lost": ["node4"],
                                                    "from": {"F": 4, "R": 1, "S": 2, "nodes": 4},
                                                    "to": {"F": 3, "R": 1, "S": 2, "nodes": 3}}


def test_a_later_invocation_resumes_a_shrunk_run_on_its_recorded_layout(tmp_path):
    settings, runs = _runs(tmp_path)
    run = runs["fl_fsdp"]
    to = shrink.resized(run, run.spec.layout.regrid(3, 1, 2), G, "")
    to.spec.save(settings.sweep_dir / run.run_id / "spec.json")  # what the shrunk attempt's launch wrote
    store = Store(settings.sweep_dir)
    store.record(run.run_id, attempts=1, state="FAILED", cluster="local", rank_order="topology",
                 shrunk=[shrink.change(run, to, 1, ["node4"])])
    with pytest.raises(Exception, match="holds a run of another experiment"):  # the planned layout clashes
        store.check_same_experiment([run.spec], "local", "topology")
    again = shrink.as_recorded(run, store.entries[run.run_id], G)
    store.check_same_experiment([again.spec], "local", "topology")
    assert (again.spec.layout.F, again.nodes, again.spec.train.elastic) == (3, 3, True)
    assert shrink.as_recorded(run, {}, G) is run


def test_the_sweeper_shrinks_only_runs_that_lost_nodes_and_refuses_below_two_groups(tmp_path, capsys):
    settings, runs = _runs(tmp_path, "retry_shrink=true")
    sweeper = Sweeper(settings)
    planned = dict(zip(runs, plan(settings, list(runs.values()), echo=False)[0]))
    assert sweeper._resubmission(planned["fl_fsdp"]) is planned["fl_fsdp"]  # nothing lost: the same submission
    for strategy in ("fl_fsdp", "fl_hsdp"):
        sweeper.store.record(runs[strategy].run_id, attempts=1, state="FAILED")
        sweeper.lost[runs[strategy].run_id] = ["node4"]
    shrunk = sweeper._resubmission(planned["fl_fsdp"])
    assert (shrunk.run.spec.layout.F, shrunk.placement.nodes) == (3, ["node1", "node2", "node3"])
    assert sweeper.store.entries[shrunk.run.run_id]["shrunk"][0]["to"] == {"F": 3, "R": 1, "S": 2, "nodes": 3}
    assert sweeper._resubmission(planned["fl_hsdp"]) is None
    out = capsys.readouterr().out
    assert "shrinking fl_fsdp-F4-R1-S2-A2 after losing node4: (F,R,S)=(4,1,2) on 4 nodes -> (3,1,2) on 3" in out
    assert "fedshard: fl_hsdp-F2-R2-S2-A2: the 3 usable node(s) left hold 1 federation group(s)" in out
    assert "cannot shrink below F=2" in sweeper.failed["fl_hsdp-F2-R2-S2-A2"]


def test_the_tables_flag_a_shrunk_run_and_compare_it_with_fsdp_of_its_planned_size():
    change = {"from": {"strategy": "fl_fsdp", "F": 4, "R": 1, "S": 2, "A": 2},
              "to": {"strategy": "fl_fsdp", "F": 3, "R": 1, "S": 2, "A": 2}, "at_step": 60, "streams_dropped": 2}
    fsdp = make_result(run_id="fsdp-F1-R1-S8", S=8, world_size=8, train_time_s=30.0)
    fl = make_result(run_id="fl_fsdp-F4-R1-S2-A2", strategy="fl_fsdp", F=3, S=2, A=2, world_size=6,
                     train_time_s=15.0, layout_changes=[change])
    table = table3([fsdp, fl])
    row = next(r for r in table.rows if r[0] == "FL+FSDP")
    assert row[1] == "(4,1,2) → (3,1,2)*"
    assert row[table.columns.index("× faster than FSDP")] == 2.0  # against the 8-rank FSDP run it was planned beside
    assert any(note.startswith("* fl_fsdp-F4-R1-S2-A2 resumed at step 60 on (F,R,S)=(3,1,2) instead of (4,1,2)")
               and "2 data stream(s) were not trained" in note for note in table.notes)
