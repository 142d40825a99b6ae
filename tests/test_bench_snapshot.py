"""The benchmarks' generated snapshots (bench.snapshot) are captured SLURM node records, renamed, in a real mix of
states (issue 41, item 7), and the parser reads them field for field like the captures."""
import collections
import re

import pytest

from bench import snapshot
from launcher.placement import topology
from launcher.slurm import parse


@pytest.mark.parametrize("version", list(snapshot.CAPTURES))
def test_generated_nodes_are_captured_records_in_a_real_mix_of_states(version):
    n = 5000
    nodes = parse.parse_nodes(snapshot.nodes_text(n, version))
    assert [x.name for x in nodes] == snapshot.node_names(n)
    captured = snapshot.records(version)
    for node in nodes[:200]:  # every field of its captured record, the name apart
        want = parse.parse_key_values(captured[node.fields["State"]])
        assert {k: v for k, v in node.fields.items() if k != "NodeName"} == \
            {k: v for k, v in want.items() if k != "NodeName"}
    assert min(len(x.fields) for x in nodes) >= 34  # every field scontrol prints, not a handful
    states = collections.Counter(x.fields["State"] for x in nodes)
    for state, share in snapshot.MIX.items():
        assert abs(states[state] / n - share) < 0.02, (state, states[state] / n)
    busy = [x for x in nodes if x.state in ("MIXED", "ALLOCATED")]
    assert busy and all(x.fields["AllocTRES"].startswith("cpu=") for x in busy)
    assert all("Reason" in x.fields for x in nodes if x.state == "DOWN" or "DRAIN" in x.flags)
    topo = topology.build(snapshot.topology_text(n), snapshot.nodes_text(n, version))
    usable = topo.usable()
    assert 0.75 * n < len(usable) < 0.9 * n and len(topo.leaves) == -(-n // snapshot.LEAF)


def test_records_of_a_version_not_captured_are_refused():
    with pytest.raises(ValueError, match="no captured node records for SLURM 21.08"):
        snapshot.records("21.08")


def test_the_fast_field_split_reads_every_captured_line_as_the_general_one():
    """parse_key_values cuts at ' ' before a key when a record has no other blank (bench.plan_speed's 100,000
    nodes); the general pattern, any blank before a key, gives the same fields on every capture."""
    lines = [line for path in sorted(snapshot.FIXTURES.glob("slurm-*/**/*.txt"))
             for line in path.read_text().splitlines() if re.match(r"\s*[A-Z][A-Za-z0-9_:/]*=", line)]
    assert len(lines) > 300
    for line in lines + ["A=1  B= two words  C=", "Reason= x  Y=2", "A=\tb\tC=d", "K=v \tL=w"]:
        record = " " + line.strip()
        general = parse._KEY_ANY_BLANK.split(record)
        fields = dict(zip(general[1::2], map(str.strip, general[2::2])))
        assert parse.parse_key_values(line) == fields, line

