"""Preflight (launcher.actions.preflight, train.job.preflight, launcher.placement.health): what it names from
measurements, the pairs it measures, and the action and a run's own preflight on local ranks."""
import json
import subprocess
import sys

import pytest

from launcher.placement import topology
from launcher.placement.health import excluded, judge
from tests.support import ROOT, clean_env
from train.job.preflight import rounds

GB = 1e9
TREE = topology.ideal(4, [1, 2, 4]).with_bandwidth([10 * GB, 1 * GB, 0.1 * GB], "test")  # node1..4, two leaves


def _found(flops=(50e9,) * 4, pairs=None):
    hosts = sorted({n for names in TREE.leaves.values() for n in names})
    return {"ranks": [[r, hosts[r], f] for r, f in enumerate(flops)],
            "pairs": pairs if pairs is not None else [[hosts[0], hosts[1], 1.0 * GB], [hosts[2], hosts[3], 1.0 * GB],
                                                      [hosts[1], hosts[2], 0.1 * GB], [hosts[3], hosts[0], 0.1 * GB]]}


def test_nothing_slow_names_nothing():
    assert judge(_found(), TREE, 0.5) == []


def test_a_slow_rank_a_slow_node_and_a_slow_link_are_named_apart():
    hosts = sorted({n for names in TREE.leaves.values() for n in names})
    a, b, c, d = hosts
    slow_rank = judge(_found(flops=(50e9, 50e9, 10e9, 50e9)), TREE, 0.5)
    assert len(slow_rank) == 1 and slow_rank[0].startswith(f"rank 2 on {c}: matrix multiply at 10 GFLOP/s")
    # d's links to both neighbours slow, each against the other link at its level (a-b under one leaf, b-c across)
    slow_node = judge(_found(pairs=[[a, b, 1.0 * GB], [c, d, 0.02 * GB], [b, c, 0.1 * GB], [d, a, 0.02 * GB]]),
                      TREE, 0.5)
    assert slow_node == [f"node {d}: its links ran slow to every neighbour ({c} 0.02 GB/s, {a} 0.02 GB/s)"]
    assert excluded(slow_node) == [d] and excluded(slow_rank) == [c]
    slow_link = judge(_found(pairs=[[a, b, 1.0 * GB], [c, d, 0.02 * GB], [b, c, 0.1 * GB], [d, a, 0.1 * GB]]),
                      TREE, 0.5)
    assert slow_link == [f"the link between {c} and {d}: 0.02 GB/s"] and excluded(slow_link) == []


def test_every_node_is_paired_with_two_neighbours_in_disjoint_rounds():
    assert rounds([0]) == []
    assert rounds([0, 4]) == [[(0, 4)]]  # two nodes: one link, measured once
    assert rounds([0, 2, 4, 6]) == [[(0, 2), (4, 6)], [(2, 4), (6, 0)]]
    five = rounds([0, 1, 2, 3, 4])
    assert five == [[(0, 1), (2, 3)], [(1, 2), (3, 4)]] and all(len({r for p in rnd for r in p}) == 2 * len(rnd)
                                                               for rnd in five)


def _launcher(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", *args], capture_output=True, text=True,
                          cwd=ROOT, env=clean_env(slurm_client=False), timeout=timeout)


@pytest.mark.slow
def test_action_preflight_and_a_runs_own_preflight_on_local_ranks(tmp_path):
    """On 2 local virtual nodes: the action measures every rank and the one link (its verdict here depends on the
    machine's load, so the fraction is set to name nothing); a run with cluster.preflight=true checks, then
    trains."""
    checked = _launcher("action=preflight", "preflight.fraction=0.01", "preflight.bytes=65536",
                        f"results_dir={tmp_path}")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = json.loads((tmp_path / "local" / "smoke" / "preflight.json").read_text())
    assert len(found["ranks"]) == 4 and all(f > 0 for _, _, f in found["ranks"]) and found["named"] == []
    assert [sorted(p[:2]) for p in found["pairs"]] == [["node1", "node2"]] and found["pairs"][0][2] > 0
    assert "link node1 <-> node2:" in checked.stdout and "nothing slow" in checked.stdout
    trained = _launcher("cluster.preflight=true", "preflight.fraction=0.01", "preflight.bytes=65536",
                        "sweep.strategies=[fl_fsdp]", f"results_dir={tmp_path / 'run'}")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert (tmp_path / "run" / "local" / "smoke" / "fl_fsdp-F2-R1-S2-A2" / "result.json").exists()
