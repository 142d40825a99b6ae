"""scontrol parsers against real SLURM 22.05.8 captures, later formats, and bad input."""
import os
import stat
from pathlib import Path

import pytest

from launcher.slurm.parse import (
    Block,
    ParseError,
    Switch,
    parse_key_values,
    parse_nodes,
    parse_topology,
    parse_topology_block,
    parse_topology_tree,
)
from launcher.slurm.scontrol import job_nodes, job_states, lost_nodes, nodes_text, run_scontrol, topology_text
from train.contract.common import ConfigError, SlurmError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SLURM = FIXTURES / "slurm-22.05.8"
MULTI_LINE = ["show_node_lrdn0001.txt", "show_node_lrdn0002.txt", "show_node_lrdn0015_down.txt",
              "show_node_lrdn0016_drain.txt"]

# Block topology has no capture: lines as 24.11 prints them (BlockIndex is SLURM's order, not the output's).
BLOCKS = """\
BlockName=nvl01 BlockIndex=0 Nodes=nvl[0001-0004] BlockSize=4
BlockName=nvl02 BlockIndex=1 Nodes=nvl[0005-0008] BlockSize=4
AggregatedBlock=nvl[01-02] BlockIndex=4 Nodes=nvl[0001-0008] BlockSize=8
BlockName=nvl03 BlockIndex=2 Nodes=nvl[0009-0012] BlockSize=4
BlockName=nvl04 BlockIndex=3 Nodes=nvl[0013-0016] BlockSize=4
AggregatedBlock=nvl[03-04] BlockIndex=5 Nodes=nvl[0009-0016] BlockSize=8
"""


def _read(name):
    return (SLURM / name).read_text()


def _one(text):
    (node,) = parse_nodes(text)
    return node


def test_switch_tree_fixture():
    switches = parse_topology_tree(_read("show_topology.txt"))
    by_level = {level: [s for s in switches if s.level == level] for level in (0, 1, 2)}
    assert [s.name for s in by_level[0]] == ["leaf01", "leaf02", "leaf03", "leaf04"]
    assert all(len(s.nodes) == 4 and s.switches == [] for s in by_level[0])
    assert by_level[0][3].nodes == ["lrdn0013", "lrdn0014", "lrdn0015", "lrdn0016"]
    assert [(s.name, s.switches) for s in by_level[1]] == [("cell1", ["leaf01", "leaf02"]),
                                                          ("cell2", ["leaf03", "leaf04"])]
    assert by_level[1][1].nodes == [f"lrdn{i:04d}" for i in range(9, 17)]
    (spine,) = by_level[2]
    assert spine == Switch("spine", 2, 1, [f"lrdn{i:04d}" for i in range(1, 17)], ["cell1", "cell2"], {})


def test_switch_tree_matches_topology_conf():
    conf = [parse_key_values(line) for line in _read("topology.conf").splitlines()
            if line.strip() and not line.startswith("#")]
    switches = {s.name: s for s in parse_topology_tree(_read("show_topology.txt"))}
    assert list(switches) == [c["SwitchName"] for c in conf]
    for c in conf:
        if "Nodes" in c:
            assert switches[c["SwitchName"]].nodes == parse_topology_tree(
                f"SwitchName=x Level=0 LinkSpeed=1 Nodes={c['Nodes']}")[0].nodes
        else:
            assert switches[c["SwitchName"]].switches == parse_topology_tree(
                f"SwitchName=x Level=0 LinkSpeed=1 Switches={c['Switches']}")[0].switches


def test_topology_for_one_node_lists_only_its_switches():
    # `scontrol show topology lrdn0005`: referenced switches (leaf01) need not be listed.
    assert [s.name for s in parse_topology(_read("show_topology_node.txt"))] == ["leaf02", "cell1", "spine"]


def test_block_topology_keeps_output_order_and_exposes_index():
    blocks = parse_topology_block(BLOCKS)
    assert [(b.name, b.index, b.aggregated) for b in blocks] == [
        ("nvl01", 0, False), ("nvl02", 1, False), ("nvl[01-02]", 4, True),
        ("nvl03", 2, False), ("nvl04", 3, False), ("nvl[03-04]", 5, True)]
    assert blocks[2] == Block("nvl[01-02]", 4, [f"nvl{i:04d}" for i in range(1, 9)], 8, True)
    assert parse_topology(BLOCKS) == blocks


def test_block_topology_of_23_11_has_no_block_size():
    (block,) = parse_topology_block("BlockName=b1 BlockIndex=0 Nodes=gb[1-2]\n")
    assert block == Block("b1", 0, ["gb1", "gb2"], 2, False)


def test_topology_autodetect():
    assert all(isinstance(s, Switch) for s in parse_topology(_read("show_topology.txt")))
    assert parse_topology("") == [] and parse_topology("\n\n") == []
    mixed = _read("show_topology.txt") + BLOCKS.splitlines()[0] + "\n"
    with pytest.raises(ParseError, match=r"line 8: block line in a switch topology: 'BlockName=nvl01"):
        parse_topology(mixed)


def test_unknown_topology_fields_are_kept():
    (s,) = parse_topology_tree("SwitchName=s1 Level=0 LinkSpeed=100 Nodes=n[1-2] Topology=default Weight=3\n")
    assert s.extra == {"Topology": "default", "Weight": "3"} and s.link_speed == 100


@pytest.mark.parametrize("text,parser,expected", [
    ("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\nthis is not scontrol\n", parse_topology_tree,
     "line 2: no Key=Value field in 'this is not scontrol'"),
    ("\nSwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]x\n", parse_topology_tree,
     "line 2: invalid hostlist 'n[1-2]x'"),
    ("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[3-1]\n", parse_topology,
     "line 1: descending range '3-1'"),
    ("SwitchName=s1 Level=zero LinkSpeed=1\n", parse_topology_tree, "line 1: Level= not a number ('zero')"),
    ("SwitchName=s1 LinkSpeed=1\n", parse_topology_tree, "line 1: Level= missing"),
    ("SwitchName=s1 Level=0 LinkSpeed=1\nSwitchName=s1 Level=1 LinkSpeed=1\n", parse_topology_tree,
     "line 2: switch s1 listed twice"),
    ("TorusName=t1 Dims=2x2x2 Nodes=n[1-8]\n", parse_topology, "line 1: neither a switch nor a block line"),
    (BLOCKS + "SwitchName=s1 Level=0 LinkSpeed=1\n", parse_topology, "line 7: switch line in a block topology"),
    ("BlockName=b1 BlockIndex=x Nodes=n1\n", parse_topology_block, "line 1: BlockIndex= not a number"),
    # topology.conf is configuration, not `scontrol show topology` output
    (None, parse_topology_tree, "line 1: no Key=Value field in '# Leonardo-like toy"),
])
def test_bad_topology_names_line(text, parser, expected):
    with pytest.raises(ParseError) as err:
        parser(_read("topology.conf") if text is None else text)
    assert expected in str(err.value)


def test_node_fixtures():
    nodes = {n.name: n for n in parse_nodes(_read("show_node_oneliner.txt"))}
    assert list(nodes) == [f"lrdn{i:04d}" for i in range(1, 17)]
    assert all(n.gpus == 4 and n.partitions == ["boost_usr_prod"] for n in nodes.values())
    mixed, down, drained = nodes["lrdn0001"], nodes["lrdn0015"], nodes["lrdn0016"]
    assert (mixed.state, mixed.flags, mixed.usable) == ("MIXED", set(), True)
    assert mixed.fields["OS"] == "Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)"
    assert (down.state, down.flags, down.usable) == ("DOWN", set(), False)
    assert down.fields["Reason"] == "fixture down [root@2026-11-29T07:21:04]"
    assert (drained.state, drained.flags, drained.usable) == ("IDLE", {"DRAIN"}, False)
    assert drained.fields["Reason"] == "fixture maint [root@2026-11-29T07:21:04]"
    assert sum(n.usable for n in nodes.values()) == 14


def test_one_line_and_multi_line_forms_agree():
    multi = parse_nodes("\n".join(_read(name) for name in MULTI_LINE))
    one = {n.name: n for n in parse_nodes(_read("show_node_oneliner.txt"))}
    assert [n.name for n in multi] == ["lrdn0001", "lrdn0002", "lrdn0015", "lrdn0016"]
    for node in multi:
        if node.name == "lrdn0002":
            # captured at another moment than the one-liner: only these live readings differ
            volatile = {"CPULoad", "FreeMem", "LastBusyTime"}
            assert {k for k in node.fields if node.fields[k] != one[node.name].fields[k]} == volatile
            for n in (node, one[node.name]):
                for key in volatile:
                    n.fields.pop(key)
        assert node == one[node.name]


@pytest.mark.parametrize("state,base,flags,usable", [
    ("DOWN*", "DOWN", {"NOT_RESPONDING"}, False),
    ("IDLE*", "IDLE", {"NOT_RESPONDING"}, False),
    ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", {"DRAIN", "NOT_RESPONDING"}, False),
    ("MIXED+DRAIN", "MIXED", {"DRAIN"}, False),
    ("IDLE+CLOUD", "IDLE", {"CLOUD"}, True),
    ("IDLE+CLOUD+POWERED_DOWN", "IDLE", {"CLOUD", "POWERED_DOWN"}, False),
    ("IDLE+MAINTENANCE+RESERVED", "IDLE", {"MAINTENANCE", "RESERVED"}, False),
    ("IDLE+PLANNED", "IDLE", {"PLANNED"}, False),
    ("MIXED+COMPLETING", "MIXED", {"COMPLETING"}, False),
    ("ALLOCATED", "ALLOCATED", set(), False),
    ("DRAINED", "DRAINED", set(), False),
    ("FUTURE", "FUTURE", set(), False),
])
def test_node_states(state, base, flags, usable):
    node = _one(_read("show_node_lrdn0015_down.txt").replace("State=DOWN ", f"State={state} "))
    assert (node.state, node.flags, node.usable) == (base, flags, usable)


@pytest.mark.parametrize("gres,gpus", [
    ("gpu:4", 4), ("gpu:a100:4", 4), ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:2,gpu:h100:2", 4),
    ("gpu:a100:2(S:0,2),shard:a100:8,gpu:h100:2(S:1)", 4), ("(null)", 0), ("", 0), ("shard:8", 0),
])
def test_gpus_from_gres(gres, gpus):
    assert _one(_read("show_node_lrdn0002.txt").replace("Gres=gpu:4", f"Gres={gres}")).gpus == gpus


def test_unknown_node_fields_are_kept():
    text = _read("show_node_oneliner.txt").splitlines()[0] + " ResumeAfterTime=None Comment=rack A, row 3"
    node = _one(text)
    assert node.fields["ResumeAfterTime"] == "None" and node.fields["Comment"] == "rack A, row 3"
    assert node.fields["ExtSensorsTemp"] == "n/s"


def test_key_values_of_job_and_partition_records():
    job = parse_key_values(_read("show_job_pending_switches.txt"))
    assert job["JobState"] == "PENDING" and job["Switches"] == "1@00:05:00" and job["NodeList"] == ""
    assert job["AllocNode:Sid"] == "vm:2700" and job["CPUs/Task"] == "1" and job["ReqB:S:C:T"] == "0:0:*:*"
    assert job["TRES"] == "cpu=5,mem=2470000M,node=5,billing=5" and job["Power"] == ""
    assert parse_key_values(_read("show_job_running.txt"))["TresPerNode"] == "gres:gpu:2"
    assert parse_key_values(_read("show_partition.txt"))["Nodes"] == "lrdn[0001-0016]"


@pytest.mark.parametrize("text,expected", [
    ("NodeName=n1 State=IDLE\nNodeName=n2 State=BROKEN Gres=gpu:4\n", "line 2: node n2 has unknown state 'BROKEN'"),
    ("NodeName=n1 State=IDLE+\n", "line 1: node n1 has an empty flag in State=IDLE+"),
    ("NodeName=n1 Gres=gpu:4\n", "line 1: node n1 has no State= field"),
    ("NodeName=n1 State=IDLE Gres=gpu:a100\n", "line 1: node n1: no GPU count in Gres item 'gpu:a100'"),
    ("NodeName=n1 State=IDLE\n\nNo nodes here\n", "line 3: no Key=Value field in 'No nodes here'"),
    ("   State=IDLE\n", "line 1: indented line outside a record"),
    ("PartitionName=p Nodes=n1\n", "line 1: record does not start with NodeName="),
    ("NodeName=n1 State=IDLE State=DOWN\n", "line 1: field State= appears twice"),
])
def test_bad_nodes_name_line(text, expected):
    with pytest.raises(ParseError) as err:
        parse_nodes(text)
    assert expected in str(err.value)


def test_snapshot_directory(tmp_path):
    (tmp_path / "topology.txt").write_text(_read("show_topology.txt"))
    assert topology_text(str(tmp_path)) == _read("show_topology.txt")
    with pytest.raises(ConfigError, match=f"snapshot file {tmp_path / 'nodes.txt'} does not exist"):
        nodes_text(str(tmp_path))


def _fake_scontrol(tmp_path, monkeypatch, body):
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_run_scontrol_without_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SlurmError, match=r"^scontrol not found on PATH \("):
        run_scontrol(["show", "topology"])


def test_run_scontrol_failure_reports_first_stderr_line(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, monkeypatch, 'echo "slurm_load_node error: Unable to contact slurm controller" >&2\n'
                                          'echo "second line" >&2\nexit 1\n')
    with pytest.raises(SlurmError) as err:
        run_scontrol(["-o", "show", "node"])
    assert str(err.value) == ("scontrol -o show node failed with exit code 1: "
                              "slurm_load_node error: Unable to contact slurm controller")


def test_live_texts_come_from_scontrol(tmp_path, monkeypatch):
    _fake_scontrol(tmp_path, monkeypatch, 'echo "$*" "${SLURM_TOPO_LEN:-untruncated}"\n')
    monkeypatch.setenv("SLURM_TOPO_LEN", "64")
    assert topology_text(None) == "show topology untruncated\n"
    assert nodes_text(None) == "-d -o show node untruncated\n"
    assert os.environ["SLURM_TOPO_LEN"] == "64"


def test_job_states_ask_squeue_once_for_all_jobs(tmp_path, monkeypatch):
    """A sweep's poll asks SLURM once for every running job; only jobs squeue no longer lists are asked of
    scontrol (a finished one answers, a forgotten one is None)."""
    calls = tmp_path / "calls"
    (tmp_path / "squeue").write_text(f'#!/bin/sh\necho "squeue $*" >> {calls}\n'
                                     'printf "101 RUNNING\\n102 COMPLETING\\n"\n')
    (tmp_path / "squeue").chmod(0o755)
    _fake_scontrol(tmp_path, monkeypatch, f'echo "scontrol $*" >> {calls}\n'
                                          'case "$*" in *103*) echo "JobId=103 JobState=COMPLETED";; '
                                          '*) echo "slurm_load_jobs error: Invalid job id" >&2; exit 1;; esac\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert job_states(["101", "102", "103", "104"]) == {"101": "RUNNING", "102": "COMPLETING", "103": "COMPLETED",
                                                         "104": None}
    assert calls.read_text().splitlines() == ["squeue -h -j 101,102,103,104 -o %i %T", "scontrol -o show job 103",
                                              "scontrol -o show job 104"]


def test_a_jobs_nodes_and_which_of_them_slurm_has_lost(tmp_path, monkeypatch):
    """What retry_shrink reads: the nodes a running job holds, then which of them went down or drained."""
    _fake_scontrol(tmp_path, monkeypatch, 'case "$*" in\n'
                   '"-o show job 7") echo "JobId=7 JobState=RUNNING NodeList=tb[1-3] BatchHost=tb1";;\n'
                   '"-o show job 8") echo "JobId=8 JobState=PENDING NodeList=(null)";;\n'
                   '"-o show node tb[1-3]") printf "NodeName=tb1 State=MIXED\\nNodeName=tb2 State=DOWN+NOT_RESPONDING'
                   '\\nNodeName=tb3 State=IDLE+DRAIN\\n";;\n'
                   '*) echo "slurm_load_jobs error: Invalid job id" >&2; exit 1;;\nesac\n')
    assert job_nodes("7") == ["tb1", "tb2", "tb3"]
    assert job_nodes("8") == [] and job_nodes("9") == []  # holds none now / SLURM forgot it
    assert lost_nodes(["tb1", "tb2", "tb3"]) == ["tb2", "tb3"]
    assert lost_nodes(["tb9"]) == []  # scontrol cannot say: nothing is called lost
