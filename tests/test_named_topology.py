"""SLURM >= 25.05 holds several named topologies (topology.yaml): the plan reads the one cluster.topology_name
or the partition's Topology= names, asks for it by name only where scontrol --version allows, and refuses a
name the cluster lacks. scontrol is a stand-in script answering from the 25.11.7 captures."""
import shutil
import subprocess

import pytest

from launcher.placement import topology
from launcher.settings import compose
from launcher.slurm.scontrol import topology_names
from tests.support import ROOT
from train.contract.common import ConfigError

CAPTURES = ROOT / "tests" / "fixtures" / "slurm-25.11.7"
YAML = CAPTURES / "multi_topology_yaml"
NODES = CAPTURES / "tree_topology_conf" / "show_node_oneliner.txt"  # the same 8 nodes, captured with a tree
SCONTROL = f"""#!/bin/sh
case "$*" in
  "--version") echo "slurm {{version}}" ;;
  "show topoconf") cat {YAML}/show_topoconf.txt ;;
  "show topology") cat {YAML}/show_topology_default.txt ;;
  "show topology ib") cat {YAML}/show_topology_ib.txt ;;
  "show topology nvl") cat {YAML}/show_topology_nvl.txt ;;
  "-o show partition nvl_test"|"-o show partition") cat {YAML}/show_partition_nvl.txt ;;
  "-o show partition boost_usr_prod") echo "PartitionName=boost_usr_prod Nodes=lrdn[0001-0008] State=UP" ;;
  "-d -o show node") cat {NODES} ;;
  "show config") echo "ClusterName             = lab" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""
BW = "cluster.bandwidth_GBps=[240,100,25,12.5]"


def _load(tmp_path, monkeypatch, *overrides, version="25.11.7"):
    script = tmp_path / "scontrol"
    script.write_text(SCONTROL.format(version=version))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    settings = compose(["cluster=leonardo", "cluster.topology=live", BW, f"results_dir={tmp_path}", *overrides])
    return topology.load(settings.cluster)


def test_topoconf_names_every_topology_and_the_default():
    assert topology_names((YAML / "show_topoconf.txt").read_text()) == (["ib", "nvl"], "ib")


def test_the_partitions_topology_is_read_by_name(tmp_path, monkeypatch):
    topo, source, live = _load(tmp_path, monkeypatch, "cluster.partition=nvl_test")
    assert live and source.endswith("topology nvl")
    assert topo.leaves["nvl01"] == ["lrdn0001", "lrdn0002"] and topo.level["nvl[01-02]"] == 1  # blocks


@pytest.mark.parametrize("overrides", [("cluster.partition=nvl_test", "cluster.topology_name=ib"), ()])
def test_topology_name_wins_and_the_default_is_asked_for_without_a_name(tmp_path, monkeypatch, overrides):
    topo, source, _ = _load(tmp_path, monkeypatch, *overrides)
    assert ", topology" not in source  # ib is the cluster's default: asked for without a name
    assert topo.leaves["leaf01"] == ["lrdn0001", "lrdn0002"] and topo.level["spine"] == 2  # the ib tree


def test_an_unknown_name_is_one_line_listing_the_clusters(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^unknown topology 'nvl72' \(cluster.topology_name\): this cluster "
                                          r"has ib, nvl$"):
        _load(tmp_path, monkeypatch, "cluster.topology_name=nvl72")


def test_a_name_before_25_05_is_refused_and_no_name_is_asked_for(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"cluster.topology_name=nvl needs SLURM >= 25.05 .* this scontrol is "
                                          r"22.5"):
        _load(tmp_path, monkeypatch, "cluster.topology_name=nvl", version="22.05.8")
    topo, source, _ = _load(tmp_path, monkeypatch, "cluster.partition=nvl_test", version="24.11.1")
    assert "leaf01" in topo.leaves and "topology nvl" not in source  # before 25.05 a name would be a node list


def test_a_snapshot_holds_each_named_topology(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(YAML / "show_topoconf.txt", snap / "topoconf.yaml")
    shutil.copy(YAML / "show_topology_default.txt", snap / "topology.txt")
    shutil.copy(YAML / "show_topology_nvl.txt", snap / "topology-nvl.txt")
    shutil.copy(NODES, snap / "nodes.txt")
    settings = compose(["cluster=leonardo", f"cluster.snapshot={snap}", BW, "cluster.topology_name=nvl"])
    topo, source, _ = topology.load(settings.cluster)
    assert "nvl01" in topo.leaves and source.endswith("topology nvl")
    settings = compose(["cluster=leonardo", f"cluster.snapshot={snap}", BW, "cluster.topology_name=ib"])
    assert "leaf01" in topology.load(settings.cluster)[0].leaves  # the default: topology.txt
    (snap / "topology-nvl.txt").unlink()
    settings = compose(["cluster=leonardo", f"cluster.snapshot={snap}", BW, "cluster.topology_name=nvl"])
    with pytest.raises(ConfigError, match="snapshot file .*topology-nvl.txt does not exist"):
        topology.load(settings.cluster)


@pytest.mark.parametrize("version,named", [("25.11.7", True), ("22.05.8", False)])
def test_capture_keeps_every_named_topology_from_25_05(tmp_path, monkeypatch, version, named):
    script = tmp_path / "scontrol"
    script.write_text(SCONTROL.format(version=version))
    script.chmod(0o755)
    snap = tmp_path / "snap"
    done = subprocess.run([str(ROOT / "slurm" / "capture.sh"), str(snap)], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 0, done.stderr
    extra = {"topoconf.yaml", "topology-ib.txt", "topology-nvl.txt"}  # SLURM >= 25.05's named topologies
    every = {"topology.txt", "nodes.txt", "partitions.txt", "config.txt"}  # init_cluster reads the last two
    assert {p.name for p in snap.iterdir()} == every | (extra if named else set())
    assert "ClusterName" in (snap / "config.txt").read_text()
    if named:
        assert (snap / "topology-nvl.txt").read_text() == (YAML / "show_topology_nvl.txt").read_text()
        settings = compose(["cluster=leonardo", f"cluster.snapshot={snap}", BW, "cluster.partition=nvl_test"])
        assert topology.load(settings.cluster)[1].endswith("topology nvl")  # the partition's, from the capture
