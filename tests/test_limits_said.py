"""Limits are checked, or the plan says they are not (issue 57, item 5): a plan with cluster.gpu_memory_GB unknown
says in one line that memory per device is not checked; cluster.mem without a unit below 1 GB per task (480,
meant as GB, was `#SBATCH --mem=480`, 480 MB) is refused; an F that does not divide sweep.paper_nodes is refused
naming the F values that work, where F=3 silently became 2 groups."""
import shutil

import pytest

from launcher.actions.plan import plan
from launcher.settings import compose
from launcher.sweep import expand, scaled_F
from tests.support import ROOT
from train.contract.common import ConfigError

NOT_CHECKED = "WARNING: memory per device NOT checked: cluster.gpu_memory_GB is null (unknown)"


@pytest.mark.parametrize("memory, warned", [("null", True), ("186", False)])
def test_a_plan_with_gpu_memory_unknown_says_memory_is_not_checked(tmp_path, capsys, memory, warned):
    snap = tmp_path / "snap"
    shutil.copytree(ROOT / "tests" / "fixtures" / "nvl72", snap)
    settings = compose(["cluster=nvl72", f"cluster.snapshot={snap}", f"cluster.gpu_memory_GB={memory}",
                        "sweep=smoke", "action=plan", f"results_dir={tmp_path / 'results'}"])
    plan(settings)
    lines = [line for line in capsys.readouterr().out.splitlines() if NOT_CHECKED in line]
    assert len(lines) == (1 if warned else 0)


def test_cpu_clusters_have_no_device_memory_to_warn_about(tmp_path, capsys):
    plan(compose(["action=plan", f"results_dir={tmp_path}"]))  # cluster=local: host memory is checked instead
    assert NOT_CHECKED not in capsys.readouterr().out


@pytest.mark.parametrize("mem", ["480", "4095"])
def test_a_bare_mem_below_a_gigabyte_per_task_is_refused(mem):
    with pytest.raises(ConfigError, match=rf"^cluster.mem={mem} has no unit, so sbatch reads {mem} MB per node: "
                                          rf"under 1 GB for each of its 4 tasks: write the unit, cluster.mem={mem}G"):
        compose(["cluster=leonardo", f"cluster.mem={mem}"])


@pytest.mark.parametrize("mem", ["480G", "480M", "4096", "0", "494000M", "2T"])
def test_mem_with_a_unit_or_enough_megabytes_is_taken(mem):
    assert str(compose(["cluster=leonardo", f"cluster.mem={mem}"]).cluster.mem) == mem


def test_an_F_that_does_not_divide_paper_nodes_is_refused_naming_those_that_do():
    with pytest.raises(ConfigError) as err:
        expand(compose(["sweep=paper_table3", "sweep.F=[3]"]))  # 4 local nodes; F refers to 128
    assert str(err.value) == (
        "sweep.F: F=3 federation groups do not divide sweep.paper_nodes=128, the node count the sweep's F refers to, "
        "so it has no proportion to keep at 4 nodes (it would become 2 groups): use an F that divides 128 (2, 4, 8, "
        "16, 32, 64, 128), or sweep.paper_nodes=null and an F that divides 4 (2, 4)")


@pytest.mark.parametrize("F, nodes, paper, scaled", [(16, 4, 128, 2), (16, 8, 128, 2), (64, 4, 128, 2),
                                                     (16, 32, 128, 4), (3, 128, 128, 3), (3, 4, None, 3)])
def test_F_that_divides_paper_nodes_scales_as_before(F, nodes, paper, scaled):
    assert scaled_F(F, nodes, paper)[0] == scaled
