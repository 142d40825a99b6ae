"""Planning for a cluster reads this machine's SLURM only when it is that cluster's (cluster.topology=auto),
and the plan's first line says which topology it used. scontrol is a stand-in script on PATH."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import PYTHON_ONLY, ROOT, clean_env

FIXTURES = ROOT / "tests" / "fixtures" / "slurm-22.05.8"
SCONTROL = """#!/bin/sh
case "$*" in
  "--version") echo "slurm 22.05.8" ;;
  "show config") {config} ;;
  "show topology") /bin/cat {fixtures}/show_topology.txt ;;
  "-d -o show node") /bin/cat {fixtures}/show_node_oneliner.txt ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
"""
ANSWERS = {"other": 'echo "ClusterName             = othercluster"',
           "leonardo": 'echo "ClusterName             = leonardo"',
           "no-controller": 'echo "resolve_ctls_from_dns_srv: res_nsearch error: Unknown host" >&2; exit 1'}


def _plan(tmp_path: Path, answer: str, *overrides: str) -> tuple[subprocess.CompletedProcess, dict]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(SCONTROL.format(config=ANSWERS[answer], fixtures=FIXTURES))
    script.chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}:{PYTHON_ONLY}")
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "cluster=leonardo", "action=plan",
                           "cluster.nodes=8", f"results_dir={tmp_path / 'results'}", *overrides],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    path = tmp_path / "results" / "leonardo" / "smoke" / "plan.json"
    plan = json.loads(path.read_text()) if proc.returncode == 0 else {}
    return proc, plan


@pytest.mark.parametrize("answer,source", [
    ("other", "ideal tree (cluster.nodes_per_level): this machine's SLURM is cluster 'othercluster', not 'leonardo'"),
    ("no-controller", "ideal tree (cluster.nodes_per_level): no SLURM controller answered"),
])
def test_another_clusters_slurm_is_not_read(tmp_path, answer, source):
    proc, plan = _plan(tmp_path, answer)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("sweep smoke on cluster leonardo (") and source in first
    assert plan["topology"].startswith(source)
    assert all(not h.startswith("lrdn") for r in plan["runs"] for h in r["nodes"])  # ideal tree nodes


@pytest.mark.parametrize("answer,overrides", [("leonardo", ()), ("other", ("cluster.topology=live",))])
def test_the_live_topology_is_read_when_it_is_this_clusters_or_asked_for(tmp_path, answer, overrides):
    proc, plan = _plan(tmp_path, answer, *overrides)
    assert proc.returncode == 0, proc.stderr
    assert "live scontrol" in proc.stdout.splitlines()[0]
    assert all(h.startswith("lrdn") for r in plan["runs"] for h in r["nodes"])  # the fixture's nodes


def test_ideal_is_never_live(tmp_path):
    proc, plan = _plan(tmp_path, "leonardo", "cluster.topology=ideal")
    assert proc.returncode == 0, proc.stderr
    assert plan["topology"] == "ideal tree (cluster.nodes_per_level): cluster.topology=ideal"
