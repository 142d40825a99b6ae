"""Hostlist expansion must match real SLURM 22.05 output, and compress must round-trip in order."""
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.slurm.hostlist import ParseError, compress, expand
from train.contract.common import ConfigError

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _cases():
    rows = [line.split("\t") for line in (FIXTURES / "hostlist_cases.tsv").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    return [pytest.param(expr, slurm_2205, id=expr) for expr, slurm_2205, *_ in rows]


@pytest.mark.parametrize("expr,slurm_2205", _cases())
def test_matches_slurm_22_05(expr, slurm_2205):
    if slurm_2205.startswith("ERROR"):
        with pytest.raises(ParseError, match="after the last") as err:
            expand(expr)
        assert repr(expr) in str(err.value)
    else:
        assert expand(expr) == slurm_2205.split()
        assert expand(compress(expand(expr))) == expand(expr)


def test_parse_error_is_a_config_error():
    assert issubclass(ParseError, ConfigError)


def test_four_groups_nest_from_second_to_last():
    # Not in the tsv: follows hostlist.c, which recurses on the last '[' of the prefix
    # (c slowest, then b, then a; the last group d always fastest), as the 3-group row shows.
    hosts = expand("a[1-2]b[1-2]c[1-2]d[1-2]")
    assert hosts[:4] == ["a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2"]
    assert hosts[4:6] == ["a1b2c1d1", "a1b2c1d2"]
    assert hosts[8] == "a1b1c2d1" and len(hosts) == len(set(hosts)) == 16


@pytest.mark.parametrize("expr,part", [
    ("", "empty hostlist"),
    ("   ", "empty hostlist"),
    ("n[1-2", "unclosed '['"),
    ("n1-2]", "']' without '['"),
    ("n[1-[2]]", "nested '['"),
    ("n[]", "empty range"),
    ("n[1,,2]", "empty range"),
    ("a,,b", "empty item"),
    ("a,", "empty item"),
    ("n[3-1]", "descending range '3-1'"),
    ("n[a-c]", "non-numeric range 'a-c'"),
    ("n[1-]", "non-numeric range '1-'"),
    ("n[-1]", "non-numeric range '-1'"),
    ("n[1-2]x", "text 'x' after the last ']'"),
    ("n1 n2", "whitespace"),
])
def test_bad_expressions_name_the_offending_part(expr, part):
    with pytest.raises(ParseError) as err:
        expand(expr)
    assert part in str(err.value)


def test_expanding_100k_nodes():  # its speed is measured by bench.placement, never asserted here
    names = [f"n{i:05d}" for i in range(1, 100_001)]
    assert compress(names) == "n[00001-65536,65537-100000]"  # SLURM's ranges hold at most 65,536 hosts
    hosts = expand(compress(names))
    assert len(hosts) == 100_000 and hosts[0] == "n00001" and hosts[-1] == "n100000"


@pytest.mark.parametrize("expr,message", [
    # scontrol show hostnames (SLURM 22.05, the testbed): n[0-65535] expands, n[1-65537] is an invalid hostlist
    ("n[1-65537]", "range '1-65537' in 'n[1-65537]' holds 65,537 hosts; SLURM refuses more than 65,536"),
    ("n[0-99999999]", "holds 100,000,000 hosts"),  # was 31 s into a MemoryError
    ("a[1-65536]b[1-65536]", "expands to 4,294,967,296 hosts, more than the 1,048,576 fedshard accepts"),
    ("a[\u0663-\u0665]", "non-numeric range"),  # Arabic-Indic digits: scontrol says invalid hostlist
])
def test_hostlists_slurm_refuses_are_refused_at_once(expr, message):
    with pytest.raises(ParseError, match=re.escape(message)):
        expand(expr)


def test_only_ascii_digits_are_numbers():
    assert expand("n[0-65535]")[-1] == "n65535" and len(expand("n[1-60000],m[1-60000]")) == 120_000
    assert expand("n\u0661") == ["n\u0661"]  # one literal host, as scontrol shows it
    assert compress(["n\u0661", "n1"]) == "n\u0661,n1"  # not n1: another host


@pytest.mark.parametrize("hosts,expr", [
    (["lrdn0001", "lrdn0002", "lrdn0003", "lrdn0004", "lrdn0007"], "lrdn[0001-0004,0007]"),
    (["n3", "n1", "n2"], "n[3,1-2]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n09", "n10", "n11"], "n[09-11]"),
    (["n9", "n010"], "n[9,010]"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    (["login", "n1", "n2", "gw"], "login,n[1-2],gw"),
    (["rack1-node01", "rack1-node02", "rack2-node01"], "rack1-node[01-02],rack2-node01"),
    (["10.140.71.103", "10.140.71.104"], "10.140.71.[103-104]"),
    (["n1", "n1"], "n[1,1]"),
])
def test_compress(hosts, expr):
    assert compress(hosts) == expr
    assert expand(expr) == hosts


@pytest.mark.parametrize("host", ["a[1]", "a,b", "a b", ""])
def test_compress_rejects_names_a_hostlist_cannot_hold(host):
    with pytest.raises(ParseError, match="cannot compress"):
        compress(["n1", host])


_host_lists = st.tuples(
    st.sampled_from(["lrdn", "n", "rack1-node", "gpu-a", "x9y"]),
    st.integers(min_value=1, max_value=5),
    st.lists(st.integers(min_value=0, max_value=99_999), min_size=1, max_size=60, unique=True),
).map(lambda t: [f"{t[0]}{n:0{t[1]}d}" for n in t[2]])


@given(st.lists(_host_lists, min_size=1, max_size=4).map(lambda ls: list(dict.fromkeys(h for hs in ls for h in hs))))
def test_compress_round_trips_in_order(hosts):
    assert expand(compress(hosts)) == hosts
