"""The plan prices faults (issue 56, item 6; launcher/fault_tolerance.py): each run's expected goodput at
cluster.node_mtbf_h, restarting from its last checkpoint and, for FL runs, as fault-tolerant groups."""
import re
import subprocess
import sys

import pytest

from launcher.fault_tolerance import goodput, rejoin_cost_s, restart_cost_s
from tests.support import ROOT, clean_env
from train.contract.config import HEARTBEAT_MS


def test_the_formulas_on_numbers_worked_by_hand():
    # 128 nodes failing every 6,400 h: one fault per 50 h = 180,000 s; a fault costing 1,800 s keeps 100/101
    assert goodput(128, 6400, 1800) == pytest.approx(1 / 1.01)
    # restart: 300 s, then half of 64 steps of 2 s trained again
    assert restart_cost_s(2.0, 64, 300) == 364
    # one of 128 groups: 300 s requeue, 8 s heal, half of A = 8 steps of 2 s; the others wait one heartbeat
    assert rejoin_cost_s(2.0, 8, 128, 8.0, 300) == pytest.approx((300 + 8 + 8) / 128 + HEARTBEAT_MS / 1000)


def test_a_fault_costs_groups_less_than_a_restart_once_a_group_is_a_small_share_of_the_run():
    for F in (4, 16, 128):
        assert rejoin_cost_s(2.0, 8, F, 10.0, 300) < restart_cost_s(2.0, 64, 300)


def test_the_plan_prints_each_runs_goodput_on_leonardo_at_a_stated_mtbf(tmp_path):
    def plan(*extra):
        proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", "cluster=leonardo",
                               "action=plan", f"results_dir={tmp_path}", *extra], capture_output=True, text=True,
                              cwd=ROOT, env=clean_env(slurm_client=False), timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "expected goodput" not in plan()  # no MTBF, no price
    out = plan("cluster.node_mtbf_h=6335")
    assert "expected goodput with each node failing every 6335 h on average" in out
    rows = {m.group(1): m for m in re.finditer(r"^  (\S+): a fault every 49.5 h; restart from the last checkpoint "
                                               r"\(every \d+ steps\) ([\d.]+)%(?:; fault-tolerant groups ([\d.]+)%)?",
                                               out, re.M)}
    assert set(rows) == {"fsdp-F1-R1-S512", "hsdp-F1-R128-S4", "fl_fsdp-F128-R1-S4-A8", "fl_hsdp-F16-R8-S4-A8"}
    assert rows["fsdp-F1-R1-S512"].group(3) is None  # one group: nothing to fail over to
    for run in ("fl_fsdp-F128-R1-S4-A8", "fl_hsdp-F16-R8-S4-A8"):
        assert float(rows[run].group(3)) > float(rows[run].group(2))


def test_the_plan_shows_a_fault_tolerant_runs_job_for_one_federation_group(tmp_path):
    """On SLURM each group of a fault-tolerant run is a job of its own (launcher.actions.groups): the plan's script is
    group 0's, on the group's nodes, not requeued by SLURM (the launcher submits a lost group again), its seat
    exported to every task, and under one switch when the run asks for its topology and the group spans nodes."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", "cluster=leonardo", "action=plan",
                           "sweep.strategies=[fl_hsdp]", "train.fault_tolerance=groups", "+cluster.sbatch_extra."
                           "switches=4@05:00", f"results_dir={tmp_path}"], capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(slurm_client=False), timeout=300)
    assert proc.returncode == 0, proc.stderr
    script = (tmp_path / "leonardo" / "paper_table3" / "scripts" / "fl_hsdp-F16-R8-S4-A8.sbatch").read_text()
    assert "one job per federation group, 16 alike (FEDSHARD_GROUP 0 to 15)" in script
    for line in ("#SBATCH --job-name=fl_hsdp-F16-R8-S4-A8-group0", "#SBATCH --nodes=8", "#SBATCH --no-requeue",
                 "#SBATCH --switches=1@05:00", "export FEDSHARD_GROUP=0", "export FEDSHARD_GROUP_START=0",
                 "export FEDSHARD_LIGHTHOUSE=http://LIGHTHOUSE_HOST:PORT"):
        assert line in script.splitlines(), (line, script)
