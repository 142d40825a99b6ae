"""action=init_cluster writes what its own "next:" command needs (issue 57, item 3): one nominal bandwidth per
level of the tree the plan reads (5 on an NVL72-like block snapshot, where it wrote 3), the GPU model's NVLink
inside a node and across a block (900 GB/s on GB200, where it wrote 25), gpu_memory_GB and fp8 from the GPU model
where its name tells them, `init.out=~/DIR` as the docs type it, and one line for an init.out that is a file."""
import shutil
from pathlib import Path

import pytest
import yaml

from launcher.__main__ import main
from launcher.placement import topology
from launcher.planning import place_runs
from launcher.settings import compose
from launcher.slurm import hardware
from launcher.sweep import expand
from tests.support import ROOT

FIXTURES = ROOT / "tests" / "fixtures"


def _init(tmp_path: Path, snap: Path, capsys, name: str = "lab", out: str | None = None) -> tuple[dict, str]:
    """action=init_cluster as typed, in this process: (the written file, what it printed)."""
    out = out or str(tmp_path / "conf")
    rc = main(["action=init_cluster", f"init.name={name}", f"init.out={out}", f"cluster.snapshot={snap}",
               f"results_dir={tmp_path / 'results'}"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    path = Path(out).expanduser() / "cluster" / f"{name}.yaml"
    return yaml.safe_load(path.read_text()), printed.out


def _next_plan(tmp_path: Path, printed: str, name: str = "lab"):
    """The plan of the command init_cluster prints after `next:`, composed here: its runs placed."""
    command = next(line for line in printed.splitlines() if line.startswith("next: python -m launcher "))
    words = command.split()[4:]
    assert words[:2] == ["--config-dir", str(tmp_path / "conf")] and words[2] == f"cluster={name}"
    settings = compose([f"hydra.searchpath=[file://{words[1]}]", *words[2:], f"results_dir={tmp_path / 'results'}"])
    return settings, place_runs(settings, expand(settings))


def test_nvl72_blocks_get_a_bandwidth_per_level_and_nvlink_across_the_block(tmp_path, capsys):
    written, printed = _init(tmp_path, FIXTURES / "nvl72", capsys)
    # blocks of 18, pairs, fours, all 144: inside a node + 4 levels; the rack's NVLink as conf/cluster/nvl72.yaml has
    assert written["nodes_per_level"] == [1, 18, 36, 72, 144]
    assert written["bandwidth_GBps"] == [900, 900, 25, 12.5, 12.5]
    assert written["gpu_memory_GB"] == 186 and written["fp8"] is True and written["peak_flops"] == 2.5e15
    settings, (topo, _, _, planned, _) = _next_plan(tmp_path, printed)
    assert topo.top_level + 2 == len(settings.cluster.bandwidth_GBps) and len(planned) == 4


def test_a_tree_gets_a_bandwidth_per_level_and_a100_its_fp8_but_no_size(tmp_path, capsys):
    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(FIXTURES / "slurm-22.05.8" / "show_topology.txt", snap / "topology.txt")
    shutil.copy(FIXTURES / "slurm-22.05.8" / "show_node_oneliner.txt", snap / "nodes.txt")
    written, printed = _init(tmp_path, snap, capsys)
    assert written["nodes_per_level"] == [1, 4, 8, 16] and written["bandwidth_GBps"] == [300, 25, 12.5, 12.5]
    assert written["fp8"] is False and written["gpu_memory_GB"] is None  # the feature says a100: 40 or 80 GB
    assert "not inferred: gpu_memory_GB: the a100 is sold with several memory sizes (40 GB, 80 GB)" in printed
    _next_plan(tmp_path, printed)


def test_a_gres_type_naming_the_size_gives_the_memory(tmp_path, capsys):
    snap = tmp_path / "snap"
    shutil.copytree(FIXTURES / "nvl72", snap)
    text = (snap / "nodes.txt").read_text().replace("Gres=gpu:4 ", "Gres=gpu:nvidia_a100-sxm4-80gb:4 ")
    (snap / "nodes.txt").write_text(text.replace("GresUsed=gpu:", "GresUsed=gpu:nvidia_a100-sxm4-80gb:"))
    written, printed = _init(tmp_path, snap, capsys)
    assert written["gpu_memory_GB"] == 80 and written["fp8"] is False and written["peak_flops"] == 312e12
    assert written["bandwidth_GBps"][:2] == [300, 300]  # A100's NVLink, 600 GB/s both directions
    assert "GPU model: nvidia_a100-sxm4-80gb (Gres type), the a100 of launcher/slurm/hardware.py's table" in printed


@pytest.mark.parametrize("name, key, memory, fp8", [
    ("a100", "a100", None, False), ("A100-SXM4-40GB", "a100", 40, False), ("nvidia_h100_80gb_hbm3", "h100", 80, True),
    ("h200", "h200", 141, True), ("gb200", "gb200", 186, True), ("b200", "b200", 180, True),
    ("nvidia_gh200_480gb", "gh200", None, True),  # 480 GB is the CPU's and the GPU's memory together
    ("tesla_v100-sxm2-32gb", "v100", 32, False), ("mi250x", "mi250x", 128, False), ("mi300x", "mi300x", 192, None),
])
def test_the_gpu_table_reads_the_names_slurm_gives(name, key, memory, fp8):
    found, model = hardware.known_gpu(name)
    assert (found, hardware.gpu_memory(name, model), model.fp8) == (key, memory, fp8)


@pytest.mark.parametrize("name", ["a1000", "rtx6000", "ib"])
def test_names_that_are_no_gpu_of_the_table(name):
    assert hardware.known_gpu(name) is None


def test_init_out_under_home_as_the_docs_type_it(tmp_path, monkeypatch, capsys):
    """`init.out=~/fedshard-conf` (docs/launcher.md, conf/cluster/slurm.yaml): the shell leaves `~` after `key=`
    as it is, and Hydra's grammar has no `~` in a value: LexerNoViableAltException before the launcher expanded it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _, printed = _init(tmp_path, FIXTURES / "nvl72", capsys, out="~/fedshard-conf")
    assert (tmp_path / "fedshard-conf" / "cluster" / "lab.yaml").is_file()
    assert f"next: python -m launcher --config-dir {tmp_path}/fedshard-conf cluster=lab" in printed


@pytest.mark.parametrize("out", ["afile", "afile/below"])
def test_init_out_naming_a_file_is_one_line(tmp_path, capsys, out):
    (tmp_path / "afile").write_text("")
    rc = main(["action=init_cluster", "init.name=lab", f"init.out={tmp_path / out}",
               f"cluster.snapshot={FIXTURES / 'nvl72'}", f"results_dir={tmp_path / 'results'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"fedshard: error: init.out={tmp_path / out}: {tmp_path / 'afile'} is a file, not a "
                          f"directory")


def test_nodes_per_level_counts_the_partitions_nodes_only():
    topo = topology.build((FIXTURES / "nvl72" / "topology.txt").read_text(), None)
    from launcher.actions.init_cluster import nodes_per_level

    assert nodes_per_level(topo, [f"gb{i:03d}" for i in range(1, 37)]) == [1, 18, 36, 36, 36]
