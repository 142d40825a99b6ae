"""In-job placement: ranks are reordered by topology at job start, and the rendezvous follows rank 0."""
import json
import shutil
import subprocess
import sys

import pytest

from launcher import scheduler as schedulers
from launcher.placement import topology
from launcher.placement.injob import PlacedTrainJob
from launcher.planning import place_runs
from launcher.settings import compose
from launcher.slurm.parse import Switch
from launcher.submit import slurm_parameters
from launcher.sweep import expand
from tests.support import clean_env
from tests.test_allocate import FIXTURES
from tests.test_entrypoint import _spec
from train.contract.result import RunResult
from train.job import TrainJob


@pytest.mark.slow
def test_ranks_follow_the_topology_not_srun_order(tmp_path):
    # Tree order puts n2 (leaf a) before n1 (leaf b); srun's order is the nodelist's: n1, n2.
    topo = topology.from_switches([Switch("a", 0, 1, ["n2"], [], {}), Switch("b", 0, 1, ["n1"], [], {}),
                                   Switch("top", 1, 1, ["n1", "n2"], ["a", "b"], {})])
    topo_path = tmp_path / "topology.json"
    topo_path.write_text(json.dumps(topology.to_json(topo.with_bandwidth([3.0, 2.0, 1.0], "bw"))))
    spec = _spec(tmp_path)  # fl_fsdp F=2 R=1 S=1
    # as `python -m train` and a submitit task do, leave without interpreter finalization (train.job)
    code = (f"from launcher.placement.injob import PlacedTrainJob; "
            f"PlacedTrainJob({str(spec)!r}, {str(topo_path)!r}, 1)(); "
            f"from train.runtime.ending import leave_without_finalization; leave_without_finalization(0)")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env(SLURM_PROCID=str(p), SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_JOB_ID="77",
                                       SLURM_JOB_NODELIST="n[1-2]", SLURMD_NODENAME=f"n{p + 1}"))
             for p in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    result = RunResult.load(tmp_path / "run" / "result.json")
    assert {r.rank: r.node for r in result.ranks} == {0: "n2", 1: "n1"}
    assert "step 7/7" in outs[1][0]  # logical rank 0 (SLURM_PROCID 1) prints progress


def _leonardo_8_nodes(tmp_path, placement: str):
    """paper_table3 planned on 8 nodes of the captured Leonardo snapshot: (settings, planned runs, sbatch
    parameters of the fl_hsdp run)."""
    shutil.copy(FIXTURES / "show_topology.txt", tmp_path / "topology.txt")
    shutil.copy(FIXTURES / "show_node_oneliner.txt", tmp_path / "nodes.txt")
    settings = compose(["sweep=paper_table3", "cluster=leonardo", f"cluster.placement={placement}", "cluster.nodes=8",
                        f"cluster.snapshot={tmp_path}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
                        f"results_dir={tmp_path}"])
    planned = place_runs(settings, expand(settings))[3]
    return settings, planned, slurm_parameters(settings.cluster, planned[3])


def test_pinned_mode_pins_nodes_and_orders_ranks_with_a_hostfile(tmp_path):
    settings, planned, params = _leonardo_8_nodes(tmp_path, "pinned")
    # fl_hsdp (2,4,4) on 8 of the 13 free nodes (lrdn0001 is MIXED with its GPU use unknown): one leaf per
    # federation group, leaf02 and leaf03.
    assert params["nodelist"] == "lrdn[0005-0012]" and params["srun_args"] == ["--distribution=arbitrary"]
    assert params["setup"][-1] == f"export SLURM_HOSTFILE={tmp_path}/leonardo/paper_table3/fl_hsdp-F2-R4-S4-A8/hostfile"
    assert planned[3].placement.hostfile().splitlines()[:5] == ["lrdn0005"] * 4 + ["lrdn0006"]
    assert "switches" not in params.get("additional_parameters", {})  # pinned nodes need no --switches


def test_slurm_mode_keeps_srun_order_and_asks_for_no_switches(tmp_path):
    settings, planned, params = _leonardo_8_nodes(tmp_path, "slurm")
    assert planned[3].leaves is None and "switches" not in params.get("additional_parameters", {})
    assert "nodelist" not in params and "srun_args" not in params
    assert planned[3].placement.nodes == sorted(planned[3].placement.nodes)  # name order, rank k on node k // G
    job = schedulers.of(settings.cluster).entrypoint(planned[3], tmp_path / "spec.json", tmp_path / "topology.json")
    assert type(job) is TrainJob  # not PlacedTrainJob: SLURM_PROCID is the rank


def test_in_job_mode_asks_for_the_leaves_the_plan_spans(tmp_path):
    settings, planned, params = _leonardo_8_nodes(tmp_path, "in_job")
    assert planned[3].leaves == 2
    assert params["additional_parameters"]["switches"] == "2@05:00" and "nodelist" not in params
    job = schedulers.of(settings.cluster).entrypoint(planned[3], tmp_path / "spec.json", tmp_path / "topology.json")
    assert type(job) is PlacedTrainJob
