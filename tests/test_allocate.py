"""Topology model and placement: the captured 22.05 cluster, bad topologies, and properties on random trees."""
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.placement import allocate, topology
from launcher.slurm.parse import Node, Switch, parse_nodes
from tests.support import grid
from train.contract.common import ConfigError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm-22.05.8"
BW = [240e9, 25e9, 12.5e9, 6e9]


def captured() -> topology.Topology:
    return topology.build((FIXTURES / "show_topology.txt").read_text(),
                          (FIXTURES / "show_node_oneliner.txt").read_text()).with_bandwidth(BW, "bw")


def test_captured_cluster_avoids_down_and_drained_nodes_and_keeps_groups_low():
    topo = captured()
    assert "lrdn0015" not in topo.usable() and "lrdn0016" not in topo.usable()
    p = allocate.place(grid(3, 4, 4), 4, topo)  # 3 groups of 4 nodes: leaf04 has only 2 usable nodes
    assert "lrdn0015" not in p.nodes and "lrdn0016" not in p.nodes
    assert p.group_levels == [0, 0, 0]  # each federation group fills one leaf switch
    # leaf01 and leaf02 share cell1, leaf03 is in cell2: federation traffic crosses the spine.
    assert p.bandwidth == {"B_T": None, "B_P": None, "B_S": 240e9, "B_R": 25e9, "B_F": 6e9} and p.hierarchy_ok
    assert p.hosts[:4] == ["lrdn0001"] * 4 and p.coords[5] == (0, 1, 1, 0, 0)
    assert p.hostfile().splitlines() == p.hosts


def test_no_placement_says_why_and_what_fits():
    with pytest.raises(allocate.NoPlacement, match="needs 16 nodes .* only 14 are usable; at most 3 federation"):
        allocate.place(grid(4, 4, 4), 4, captured())


def test_assess_flags_a_placement_that_breaks_the_ordering():
    topo = captured()
    # Replicas across cells, federation groups inside a leaf: B_R < B_F.
    hosts = ["lrdn0001", "lrdn0009", "lrdn0002", "lrdn0010"]
    p = allocate.assess(grid(2, 2, 1), hosts, topo)
    assert p.bandwidth["B_R"] == 6e9 and p.bandwidth["B_F"] == 25e9 and not p.hierarchy_ok


def test_slurm_order_is_name_order_across_leaves_as_on_the_testbed():
    # The testbed's numbering: leaf1 holds tb2, tb4 and leaf2 tb1, tb3, so name order alternates leaves.
    topo = topology.from_switches([Switch("leaf1", 0, 1, ["tb2", "tb4"], [], {}),
                                   Switch("leaf2", 0, 1, ["tb1", "tb3"], [], {}),
                                   Switch("spine", 1, 1, ["tb1", "tb2", "tb3", "tb4"], ["leaf1", "leaf2"], {})])
    topo.with_bandwidth([3.0, 2.0, 1.0], "bw")
    placed = allocate.place(grid(2, 2, 2), 2, topo)  # FL+HSDP: each federation group under one leaf
    assert placed.hosts[:4] == ["tb2", "tb2", "tb4", "tb4"]
    assert placed.bandwidth == {"B_T": None, "B_P": None, "B_S": 3.0, "B_R": 2.0, "B_F": 1.0}
    slurm = allocate.in_slurm_order(placed, grid(2, 2, 2), 2, topo)
    assert slurm.nodes == ["tb1", "tb2", "tb3", "tb4"] and slurm.hosts[:4] == ["tb1", "tb1", "tb2", "tb2"]
    # Replicas now cross the spine and the federation stays in a leaf: B_R < B_F, the paper's situation.
    assert slurm.bandwidth == {"B_T": None, "B_P": None, "B_S": 3.0, "B_R": 1.0, "B_F": 2.0} and not slurm.hierarchy_ok
    assert sorted(["n10", "n9", "n1"], key=allocate._name_key) == ["n1", "n9", "n10"]


@pytest.mark.parametrize("switches,message", [
    ([Switch("a", 0, 1, ["n1", "n2"], [], {}), Switch("b", 0, 1, ["n2"], [], {})], "n2 is under two leaf"),
    ([Switch("a", 0, 1, ["n1"], [], {}), Switch("top", 1, 1, ["n1"], ["a", "ghost"], {})], "unknown child"),
    ([Switch("a", 1, 1, [], ["b"], {}), Switch("b", 1, 1, [], ["a"], {}), Switch("c", 0, 1, ["n1"], [], {})],
     "levels must increase upwards"),
    ([Switch("a", 0, 1, ["n1"], [], {}), Switch("x", 1, 1, [], ["a"], {}), Switch("y", 1, 1, [], ["a"], {})],
     "a is under both"),
])
def test_bad_topologies_are_named(switches, message):
    with pytest.raises(ConfigError, match=message):
        topology.from_switches(switches)


def test_bandwidth_must_cover_levels_and_not_increase():
    with pytest.raises(ConfigError, match="bw needs 4 values"):
        captured().with_bandwidth(BW[:3], "bw")
    with pytest.raises(ConfigError, match="not increase"):
        captured().with_bandwidth([1e9, 2e9, 1e9, 1e9], "bw")


def test_plan_from_a_snapshot_directory(tmp_path):
    from launcher.actions.plan import plan
    from launcher.settings import compose

    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(FIXTURES / "show_topology.txt", snap / "topology.txt")
    shutil.copy(FIXTURES / "show_node_oneliner.txt", snap / "nodes.txt")
    settings = compose(["sweep=paper_table3", "cluster=leonardo", f"cluster.snapshot={snap}", "cluster.nodes=8",
                        "cluster.bandwidth_GBps=[240,25,12.5,6]", f"results_dir={tmp_path}"])
    planned, entries = plan(settings)
    assert [(e.layout.F, e.layout.R, e.layout.S) for e in entries] == [(1, 1, 32), (1, 8, 4), (8, 1, 4), (2, 4, 4)]
    for p, e in zip(planned, entries):
        assert len(e.hostfile) == e.world_size and e.hierarchy_ok
        assert not {"lrdn0015", "lrdn0016"} & set(e.nodes)
        assert p.placement.nodes == e.nodes  # what is submitted is what plan.json shows
    fl_hsdp = entries[3]
    # lrdn0001 is MIXED and this capture (no -d) does not say how many of its GPUs are in use: it is not
    # planned on, so leaf01 holds 3 free nodes and the two groups of 4 go to leaf02 and leaf03, across the spine.
    assert not {"lrdn0001", "lrdn0015", "lrdn0016"} & set(fl_hsdp.nodes)
    assert fl_hsdp.bandwidth == {"B_T": None, "B_P": None, "B_S": 240e9, "B_R": 25e9, "B_F": 6e9}
    assert 0 < fl_hsdp.predicted_ratio_to_fsdp < 1
    plan_json = json.loads((tmp_path / "leonardo" / "paper_table3" / "plan.json").read_text())
    assert plan_json["nodes"]["excluded"] == {"down or drained": 2, "GPU use unknown (MIXED without GresUsed: "
                                              "capture with `scontrol -d -o show node`)": 1}
    on_disk = plan_json["runs"]
    assert on_disk == [e.to_json() for e in entries]
    assert list(on_disk[0]) == ["run_id", "strategy", "F", "R", "S", "A", "tp", "pp", "world_size", "gpus_per_node",
                                "model", "model_params", "train", "note", "nodes", "hostfile", "coords", "bandwidth",
                                "group_levels", "hierarchy_ok", "predicted_comm_s", "predicted_ratio_to_fsdp",
                                "predicted_step_s", "predicted_first_step_s", "predicted_step_bounds_s",
                                "predicted_compute_s",
                                "predicted_comm_by_group_s", "predicted_exposed_comm_s", "predicted_tokens_per_s",
                                "predicted_speedup_over_fsdp",
                                "compute_source", "checkpoint_bytes", "memory_per_device", "memory", "resources",
                                "sbatch"]


# ---------------------------------------------------------------- properties on random trees

@st.composite
def trees(draw):
    """A random 1-3 level switch tree with random node states."""
    fanout = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))  # switches per parent, by level
    leaf_sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=40))
    switches, nodes, n = [], [], 0
    level_names = []
    for i, size in enumerate(leaf_sizes):
        names = [f"n{n + j:03d}" for j in range(size)]
        n += size
        switches.append(Switch(f"leaf{i}", 0, 1, names, [], {}))
        level_names.append(f"leaf{i}")
        for name in names:
            state = draw(st.sampled_from(["IDLE", "IDLE", "IDLE", "MIXED", "ALLOCATED", "DOWN", "IDLE+DRAIN"]))
            base, _, flag = state.partition("+")
            nodes.append(Node(name, base, {flag} if flag else set(), 4, ["p"], {}))
    for level, k in enumerate(fanout, start=1):
        groups = [level_names[i:i + k + 1] for i in range(0, len(level_names), k + 1)]
        level_names = []
        for j, children in enumerate(groups):
            name = f"s{level}_{j}"
            switches.append(Switch(name, level, 1, [], children, {}))
            level_names.append(name)
    topo = topology.from_switches(switches, nodes)
    bw = sorted(draw(st.lists(st.floats(1, 1000), min_size=topo.top_level + 2, max_size=topo.top_level + 2)),
                reverse=True)
    return topo.with_bandwidth(bw, "bw")


def _under(topo, switch):
    return {n for leaf, names in topo.leaves.items() for n in names if switch == leaf or switch in topo.ancestors(leaf)}


@settings(max_examples=150, deadline=None)
@given(topo=trees(), F=st.integers(1, 6), R=st.integers(1, 3), G=st.sampled_from([1, 2, 4]),
       S_mult=st.sampled_from([1, 2]))
def test_placement_properties(topo, F, R, G, S_mult):
    S = G * S_mult
    usable = set(topo.usable())
    try:
        p = allocate.place(grid(F, R, S), G, topo)
    except allocate.NoPlacement:
        k, units = allocate.units(grid(F, R, S), G)
        assert len(usable) < k * units
        return
    world = F * R * S
    assert len(p.hosts) == world
    assert set(p.nodes) <= usable and len(set(p.nodes)) == len(p.nodes)
    assert all(p.hosts.count(n) == G for n in p.nodes)  # every slot of every chosen node, each rank once
    for f in range(F):  # shard groups on as few nodes as possible (one when S <= G)
        for r in range(R):
            ranks = range(f * R * S + r * S, f * R * S + (r + 1) * S)
            assert len({p.hosts[k] for k in ranks}) == S // G
    # Each federation group sits under the lowest switch it could use: it could not move, alone, below.
    k = max(1, R * S // G)
    free = usable - set(p.nodes)
    for f, level in enumerate(p.group_levels):
        group_nodes = set(p.hosts[f * R * S:(f + 1) * R * S])
        for switch, lvl in topo.level.items():
            if lvl < level:
                under = _under(topo, switch)
                assert len(under & free) + len(under & group_nodes) < k, (f, level, switch)
    # The bottlenecks, recomputed here from the rank grid and the switch subtrees (not with allocate/lca_level).
    def rank(f, r, s):
        return f * R * S + r * S + s

    def lowest_common_level(ranks):
        hosts = {p.hosts[k] for k in ranks}
        return -1 if len(hosts) == 1 else min(lvl for sw, lvl in topo.level.items() if hosts <= _under(topo, sw))

    def worst(groups):
        levels = [lowest_common_level(g) for g in groups if len(g) > 1]
        return topo.bandwidth[max(levels) + 1] if levels else None

    expected = {"B_T": None, "B_P": None,
                "B_S": worst([[rank(f, r, s) for s in range(S)] for f in range(F) for r in range(R)]),
                "B_R": worst([[rank(f, r, s) for r in range(R)] for f in range(F) for s in range(S)]),
                "B_F": worst([[rank(f, r, s) for f in range(F)] for r in range(R) for s in range(S)])}
    assert p.bandwidth == expected
    present = [b for b in expected.values() if b is not None]
    assert p.hierarchy_ok == all(a >= b for a, b in zip(present, present[1:]))


def test_report_verifies_where_ranks_really_ran():
    from launcher.report.verify import placement_rows
    from tests.support import make_result
    from train.contract.result import RankRecord

    topo = captured()

    def result(run_id, nodes):
        return make_result(run_id=run_id, strategy="fl_hsdp", F=2, R=2, S=1, A=2, world_size=4,
                           ranks=[RankRecord(k, "h", n) for k, n in enumerate(nodes)])

    good = result("good", ["lrdn0001", "lrdn0002", "lrdn0009", "lrdn0010"])   # replicas in a leaf, groups apart
    broken = result("broken", ["lrdn0001", "lrdn0009", "lrdn0002", "lrdn0010"])  # replicas across cells
    elsewhere = result("elsewhere", ["laptop"] * 4)
    _, rows = placement_rows([good, broken, elsewhere], topo)
    assert rows == [["broken", None, 6.0, 25.0, "BROKEN"],
                    ["elsewhere", None, None, None, "unknown (ran on laptop, not in the topology)"],
                    ["good", None, 25.0, 6.0, "ok"]]


FIXTURES_2511 = Path(__file__).resolve().parent / "fixtures" / "slurm-25.11.7" / "tree_topology_conf"


def _busy_snapshot(tmp_path: Path) -> Path:
    """The 25.11 tree capture: lrdn0001-0004 MIXED (lrdn0001 with `-d`: all 4 GPUs in use; the others
    without GresUsed), lrdn0005-0007 IDLE, lrdn0008 drained."""
    shutil.copy(FIXTURES_2511 / "show_topology.txt", tmp_path / "topology.txt")
    others = [line for line in (FIXTURES_2511 / "show_node_oneliner.txt").read_text().splitlines()
              if not line.startswith("NodeName=lrdn0001 ")]
    (tmp_path / "nodes.txt").write_text((FIXTURES_2511 / "show_node_detail_lrdn0001.txt").read_text() + "\n"
                                        + "\n".join(others) + "\n")
    return tmp_path


def test_a_node_is_free_only_when_its_free_gpus_and_cpus_hold_a_share():
    detail = parse_nodes((FIXTURES_2511 / "show_node_detail_lrdn0001.txt").read_text())[0]
    assert (detail.state, detail.gpus, detail.gpus_used, detail.cpus_free) == ("MIXED", 4, 4, 28)
    assert detail.not_free(1, 4) == "fewer than 1 GPUs free"
    assert detail.not_free(0, 28) is None and detail.not_free(0, 29) == "fewer than 29 CPUs free"  # CPU ranks
    plain = parse_nodes((FIXTURES_2511 / "show_node_lrdn0001.txt").read_text())[0]  # no -d: GresUsed absent
    assert plain.gpus_used is None and plain.not_free(4, 4).startswith("GPU use unknown")
    idle = parse_nodes((FIXTURES_2511 / "show_node_lrdn0005_idle.txt").read_text())[0]
    assert idle.gpus_used == 0 and idle.not_free(4, 32) is None
    assert parse_nodes((FIXTURES_2511 / "show_node_lrdn0008_drain.txt").read_text())[0].not_free(0, 1) == \
        "down or drained"


@pytest.mark.parametrize("placement", ["pinned", "in_job"])
def test_plans_never_use_a_node_without_a_free_share(tmp_path, placement):
    from launcher.planning import place_runs
    from launcher.settings import compose
    from launcher.sweep import expand

    settings = compose(["sweep=smoke", "cluster=leonardo", f"cluster.placement={placement}", "cluster.nodes=2",
                        f"cluster.snapshot={_busy_snapshot(tmp_path)}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
                        f"results_dir={tmp_path}"])
    _, _, usable, planned, nodes = place_runs(settings, expand(settings))
    assert usable == ["lrdn0005", "lrdn0006", "lrdn0007"]
    assert {n for p in planned for n in p.placement.nodes} == {"lrdn0005", "lrdn0006"}  # one leaf
    unknown = "GPU use unknown (MIXED without GresUsed: capture with `scontrol -d -o show node`)"
    assert nodes["excluded"] == {"fewer than 4 GPUs free": 1, unknown: 3, "down or drained": 1}
    assert nodes["note"] is None


def test_in_job_plans_on_busy_nodes_only_when_too_few_are_free_and_says_so(tmp_path):
    from launcher.planning import place_runs
    from launcher.settings import compose
    from launcher.sweep import expand

    settings = compose(["sweep=smoke", "cluster=leonardo", "cluster.nodes=7", "sweep.nodes=[4]",
                        f"cluster.snapshot={_busy_snapshot(tmp_path)}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
                        f"results_dir={tmp_path}"])
    _, _, usable, _, nodes = place_runs(settings, expand(settings))
    assert len(usable) == 7 and "lrdn0008" not in usable
    assert nodes["note"].startswith("only 3 node(s) are free now and the widest run needs 4")


def test_placement_pauses_the_cyclic_collector_and_restores_it(monkeypatch):
    """topology.build and allocate.place run with the cyclic GC off (its passes made the time per node grow
    with the cluster, bench.placement), and leave it as they found it, on success and on error."""
    import gc

    seen = []
    real_search = allocate._search

    def spy(*args):
        seen.append(gc.isenabled())
        return real_search(*args)

    monkeypatch.setattr(allocate, "_search", spy)
    allocate.place(grid(2, 1, 4), 4, captured())
    monkeypatch.undo()
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(ConfigError):
        topology.build("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=a[1-2] Switches=nowhere\n", None)
    assert gc.isenabled()
    gc.disable()
    try:
        allocate.place(grid(2, 1, 4), 4, captured())
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
