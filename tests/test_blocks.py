"""Block topologies (topology/block) as placement levels: shard groups in a node, replica groups inside the
smallest block, federation groups across blocks, and --segment in place of --switches."""
import shutil

import pytest

from launcher.placement import topology
from launcher.planning import place_runs
from launcher.settings import compose
from launcher.submit import sbatch_text, slurm_parameters
from launcher.sweep import expand
from tests.support import ROOT
from train.contract.common import ConfigError

NVL72 = ROOT / "tests" / "fixtures" / "nvl72"
CAPTURE = ROOT / "tests" / "fixtures" / "slurm-25.11.7"


def test_nested_aggregated_blocks_are_levels():
    topo = topology.build((NVL72 / "topology.txt").read_text(), (NVL72 / "nodes.txt").read_text())
    assert topo.block_size == 18 and len(topo.leaves) == 8
    assert topo.ancestors("gb001") == ["nvl01", "nvl[01-02]", "nvl[01-04]", topology.ROOT]
    assert [topo.level[s] for s in topo.ancestors("gb001")] == [0, 1, 2, 3]
    assert topo.lca_level({"gb001", "gb040"}) == 2 and topo.lca_level({"gb001", "gb080"}) == 3


def _plan(*overrides):
    settings = compose(["sweep=paper_table3", "cluster=nvl72", f"cluster.snapshot={NVL72}", *overrides])
    _, _, _, planned, nodes = place_runs(settings, expand(settings))
    return settings, planned, nodes


def test_the_nvl72_plan_keeps_replicas_in_a_rack_and_asks_for_segments(tmp_path):
    settings, planned, nodes = _plan(f"results_dir={tmp_path}")
    assert nodes["excluded"] == {"fewer than 4 GPUs free": 1, "down or drained": 1}  # gb005, gb020
    for p in planned:
        assert p.placement.hierarchy_ok and not {"gb005", "gb020"} & set(p.placement.nodes)
        params = slurm_parameters(settings.cluster, p)
        assert "switches" not in params.get("additional_parameters", {})  # a tree option; blocks take --segment
    fl_hsdp = planned[3].placement  # (16, 8, 4): a federation group of 8 nodes per half rack
    assert fl_hsdp.bandwidth == {"B_T": None, "B_P": None, "B_S": 900e9, "B_R": 900e9, "B_F": 50e9}
    assert set(fl_hsdp.group_levels) == {0}
    assert slurm_parameters(settings.cluster, planned[3])["additional_parameters"]["segment"] == 8


def test_the_sbatch_script_asks_for_segments_and_exclusive_topo_when_offered(tmp_path):
    settings, planned, _ = _plan(f"results_dir={tmp_path}", "+cluster.sbatch_extra.exclusive=topo")
    script = sbatch_text(settings.cluster, planned[3], tmp_path)
    assert "#SBATCH --segment=8" in script and "#SBATCH --exclusive=topo" in script


def test_a_segment_no_block_can_hold_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster.sbatch_extra.segment=20 cannot be met for fsdp-F1-R1-S512: "
                                          r"blocks hold 18 nodes"):
        _plan(f"results_dir={tmp_path}", "+cluster.sbatch_extra.segment=20")


def test_the_25_11_block_capture_plans_with_segments(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(CAPTURE / "multi_topology_yaml" / "show_topology_nvl.txt", snap / "topology.txt")
    shutil.copy(CAPTURE / "tree_topology_conf" / "show_node_oneliner.txt", snap / "nodes.txt")
    nodes = (snap / "nodes.txt").read_text().replace("State=MIXED", "State=IDLE").replace("CPUAlloc=4", "CPUAlloc=0")
    (snap / "nodes.txt").write_text(nodes)  # the capture's busy nodes freed: four nodes to place on
    settings = compose(["sweep=smoke", "sweep.strategies=[fl_hsdp]", "sweep.nodes=[4]", "cluster=leonardo",
                        f"cluster.snapshot={snap}", "cluster.bandwidth_GBps=[200,100,25,12.5]",
                        f"results_dir={tmp_path}"])
    _, _, _, planned, _ = place_runs(settings, expand(settings))
    p = planned[0]  # fl_hsdp (2, 2, 4): each group of 2 nodes in one 2-node block
    assert p.placement.hierarchy_ok
    assert p.placement.bandwidth == {"B_T": None, "B_P": None, "B_S": 200e9, "B_R": 100e9, "B_F": 25e9}
    assert slurm_parameters(settings.cluster, p)["additional_parameters"]["segment"] == 2


def test_an_fl_hsdp_group_no_block_can_hold_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^fl_hsdp-F4-R32-S4-A8: a federation group of 32 nodes cannot sit inside "
                                          r"one block of 18, .* choose F so that 128 / F <= 18 \(sweep.F\)$"):
        _plan(f"results_dir={tmp_path}", "sweep.F=[4]")
