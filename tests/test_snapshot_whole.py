"""A snapshot is checked whole before it is believed (issue 57, item 1): a nodes.txt cut short, missing records,
a record twice, a file that is not UTF-8, each refused in one line naming the file and the line, where the plan
used to take the nodes without a record as free (pinned on DOWN and DRAIN nodes) or skip the Gres check. The same
for a cluster file: a YAML syntax error or another encoding is one line FILE:LINE:COLUMN, not a traceback."""
import shutil
from pathlib import Path

import pytest

from launcher.planning import place_runs
from launcher.settings import compose
from launcher.submit import slurm_parameters
from launcher.sweep import expand
from tests.support import ROOT
from train.contract.common import ConfigError

LEONARDO = ROOT / "tests" / "fixtures" / "slurm-22.05.8"  # 16 nodes; lrdn0015 DOWN, lrdn0016 IDLE+DRAIN
LINES = (LEONARDO / "show_node_oneliner.txt").read_text().splitlines(keepends=True)
CUT = LINES[8][:LINES[8].index("ThreadsPerCore=") + 20]  # lrdn0009's record cut after State=IDLE


def _snapshot(tmp_path: Path, nodes, topology=None) -> Path:
    snap = tmp_path / "snap"
    snap.mkdir(parents=True)
    (snap / "topology.txt").write_bytes(topology if topology is not None
                                        else (LEONARDO / "show_topology.txt").read_bytes())
    (snap / "nodes.txt").write_bytes(nodes.encode() if isinstance(nodes, str) else nodes)
    return snap


def _pinned(tmp_path: Path, snap: Path, *overrides: str):
    """paper_table3 on 8 nodes of the snapshot, pinned: the sbatch --nodelist of every run."""
    settings = compose(["sweep=paper_table3", "cluster=leonardo", "cluster.placement=pinned", "cluster.nodes=8",
                        f"cluster.snapshot={snap}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
                        f"results_dir={tmp_path / 'results'}", *overrides])
    planned = place_runs(settings, expand(settings))[3]
    return {slurm_parameters(settings.cluster, p)["nodelist"] for p in planned}


def test_the_whole_capture_pins_no_down_or_drained_node(tmp_path):
    nodelists = _pinned(tmp_path, _snapshot(tmp_path, "".join(LINES)))
    assert nodelists and not any("0015" in n or "0016" in n or n.endswith("16]") for n in nodelists), nodelists


@pytest.mark.parametrize("nodes, message", [
    # the case: cut inside line 9, the plan pinned lrdn[0009-0016], DOWN lrdn0015 and DRAIN lrdn0016 too
    ("".join(LINES[:8]) + CUT, "nodes.txt: line 9 ends without a line break, so the file was cut short inside it"),
    ("".join(LINES[:8]) + CUT + "\n" + "".join(LINES[9:]),
     "nodes.txt: line 9: the record of node lrdn0009 stops at ThreadsPerCore= where the capture's other records go "
     "on (TmpDisk=, Weight=, Owner=, ...): the line was cut short"),
    ("".join(LINES[:8]), "nodes.txt has no record of 8 of the 16 nodes {snap}/topology.txt names (lrdn[0009-0016]; "
                         "lrdn0009 is on its line 3): a node without a record would be taken as free"),
    ("".join(LINES) + LINES[3], "nodes.txt: line 17: a second record of node lrdn0004 (the first is on line 4)"),
], ids=["file-cut-inside-a-line", "record-cut-short", "records-missing", "record-twice"])
def test_a_damaged_nodes_file_is_refused_naming_its_line(tmp_path, nodes, message):
    snap = _snapshot(tmp_path, nodes)
    with pytest.raises(ConfigError) as err:
        _pinned(tmp_path, snap)
    text = str(err.value)
    assert text.startswith(f"snapshot file {snap}/nodes.txt") and message.format(snap=snap) in text, text
    assert "\n" not in text and "slurm/capture.sh" in text


def test_an_empty_nodes_file_no_longer_skips_the_gres_check(tmp_path):
    """An empty nodes.txt planned a file claiming 8 GPUs per node with rc 0: with no record, no Gres to check."""
    snap = _snapshot(tmp_path, "")
    with pytest.raises(ConfigError, match=rf"^snapshot file {snap}/nodes.txt holds no node record, but {snap}/"
                                          rf"topology.txt names 16 nodes \(lrdn\[0001-0016\], from its line 1\)"):
        _pinned(tmp_path, snap, "cluster.gpus_per_node=8")
    whole = _snapshot(tmp_path / "whole", "".join(LINES))
    with pytest.raises(ConfigError, match="cluster.gpus_per_node=8 but the nodes of partition boost_usr_prod have 4"):
        _pinned(tmp_path, whole, "cluster.gpus_per_node=8")  # the records there: Gres=gpu:4


@pytest.mark.parametrize("which", ["topology.txt", "nodes.txt"])
def test_a_file_that_is_not_utf8_is_one_line(tmp_path, which):
    topology = (LEONARDO / "show_topology.txt").read_bytes()
    nodes = "".join(LINES).encode()
    if which == "topology.txt":
        topology = topology.replace(b"cell2", b"cell\xff2")
    else:
        nodes = nodes.replace(b"fixture maint", b"fixture \xe9 maint")  # a Reason typed in latin-1
    snap = _snapshot(tmp_path, nodes, topology)
    with pytest.raises(ConfigError) as err:
        _pinned(tmp_path, snap)
    line = 6 if which == "topology.txt" else 16
    assert str(err.value).startswith(f"snapshot file {snap}/{which}: line {line} is not UTF-8 text (byte 0x")


def test_a_parse_error_in_a_snapshot_names_its_file(tmp_path):
    snap = _snapshot(tmp_path, "".join(LINES), b"SwitchName=leaf01 Level=x LinkSpeed=1 Nodes=lrdn[0001-0016]\n")
    with pytest.raises(ConfigError, match=rf"^snapshot file {snap}/topology.txt: line 1: Level= not a number"):
        _pinned(tmp_path, snap)


def test_records_of_the_captures_are_whole():
    """The captured and generated snapshots in tests/fixtures pass the check: their shapes differ (Arch= and OS=
    only where slurmd registered, Reason= only on drained nodes, GresUsed= with -d) without any being cut short."""
    from launcher.slurm.parse import parse_nodes
    from launcher.slurm.scontrol import _cut_short

    for path in sorted((ROOT / "tests" / "fixtures").rglob("*node*.txt")):
        if not path.read_text().startswith("NodeName="):
            continue  # show_topology_node.txt and the like
        assert _cut_short(parse_nodes(path.read_text())) is None, path
    detail = (ROOT / "tests" / "fixtures" / "slurm-25.11.7" / "tree_topology_conf" / "show_node_detail_lrdn0001.txt")
    oneliners = (ROOT / "tests" / "fixtures" / "slurm-25.11.7" / "tree_topology_conf" / "show_node_oneliner.txt")
    assert _cut_short(parse_nodes(detail.read_text() + "\n" + oneliners.read_text())) is None


def _cluster_file(tmp_path: Path, text: bytes) -> Path:
    site = tmp_path / "site"
    (site / "cluster").mkdir(parents=True)
    (site / "cluster" / "mine.yaml").write_bytes(text)
    return site


def test_a_yaml_syntax_error_in_a_cluster_file_is_one_line_with_its_place(tmp_path):
    text = (ROOT / "conf" / "cluster" / "slurm.yaml").read_text().replace("partition: ???", "partition: [gpu")
    site = _cluster_file(tmp_path, text.encode())
    line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("partition:"))) + 1
    with pytest.raises(ConfigError) as err:
        compose([f"hydra.searchpath=[file://{site}]", "cluster=mine", f"results_dir={tmp_path / 'r'}"])
    assert str(err.value).startswith(f"{site}/cluster/mine.yaml:{line + 1}:1: expected ',' or ']'"), err.value
    assert f"begun at line {line}, column 12" in str(err.value) and "\n" not in str(err.value)


def test_a_cluster_file_in_another_encoding_is_one_line_with_its_place(tmp_path):
    text = (ROOT / "conf" / "cluster" / "slurm.yaml").read_bytes().replace(b"account: null", b"account: caf\xe9")
    site = _cluster_file(tmp_path, text)
    line = text.split(b"\n").index(b"account: caf\xe9") + 1
    with pytest.raises(ConfigError, match=rf"^{site}/cluster/mine.yaml:{line}:13: not UTF-8 text \(byte 0xe9\)"):
        compose([f"hydra.searchpath=[file://{site}]", "cluster=mine", f"results_dir={tmp_path / 'r'}"])


def test_a_snapshot_under_home_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(ROOT / "tests" / "fixtures" / "nvl72", tmp_path / "snap")
    settings = compose(["cluster=nvl72", "cluster.snapshot='~/snap'", f"results_dir={tmp_path / 'r'}"])
    assert settings.cluster.snapshot == f"{tmp_path}/snap"
