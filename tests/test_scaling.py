"""sweep.scaling: weak keeps the batch per GPU, strong the global batch; the report's scaling table and plot, built
from made-up results and from a real local strong-scaling sweep."""
import csv
import io
import subprocess
import sys

import pytest

from launcher.report.scaling import scaling_plot, scaling_table
from launcher.settings import compose
from launcher.sweep import expand
from tests.support import ROOT, clean_env, make_result
from train.contract.common import ConfigError
from train.contract.result import RunResult


def _batches(*overrides):
    return {(r.spec.run_id.split("-rep")[0], r.nodes): r.spec.train.batch_per_rank
            for r in expand(compose(["sweep=scaling_strong", "sweep.repeats=1", *overrides]))}


def test_strong_scaling_splits_the_global_batch_and_weak_keeps_the_per_gpu_batch():
    strong = _batches("sweep.strategies=[fsdp]", "sweep.tp=[1,2]", "sweep.pp=[1]", "train.batch_per_rank=8")
    # 16 sequences on 1 node of 2 GPUs, then 8 and 4 per GPU pair... per GPU: 8, 4, 2; a tp=2 rank holds 2 GPUs
    assert strong == {("fsdp-F1-R1-S2", 1): 8, ("fsdp-F1-R1-S4", 2): 4, ("fsdp-F1-R1-S8", 4): 2,
                      ("fsdp-F1-R1-S1-T2", 1): 16, ("fsdp-F1-R1-S2-T2", 2): 8, ("fsdp-F1-R1-S4-T2", 4): 4}
    weak = _batches("sweep.strategies=[fsdp]", "sweep.tp=[1]", "sweep.pp=[1]", "train.batch_per_rank=8",
                    "sweep.scaling=weak")
    assert set(weak.values()) == {8}


@pytest.mark.parametrize("overrides,message", [
    (["train.batch_per_rank=2"], "sweep.scaling=strong keeps the global batch of 4 sequences (batch_per_rank 2 x 2 "
                                 "GPUs on 1 node(s)), which 8 GPUs on 4 nodes cannot split evenly"),
    (["sweep.nodes=[2]"], "sweep.scaling=strong compares node counts: sweep.nodes needs at least two, got [2]"),
    (["sweep.scaling=linear"], "sweep.scaling must be one of none, weak, strong, got 'linear'"),
])
def test_scaling_sweeps_refuse_what_they_cannot_compare(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        expand(compose(["sweep=scaling_strong", *overrides]))


def _results():
    """FSDP on 2 and 4 devices and FL+FSDP on 4 and 8, three seeds each; per-device throughput falls by 20 %."""
    out = []
    for strategy, A, worlds in (("fsdp", None, (2, 4)), ("fl_fsdp", 8, (4, 8))):
        for world in worlds:
            for rep, noise in ((1, 1.0), (2, 1.02), (3, 0.98)):
                per_device = 100.0 * noise * (0.8 if world == worlds[1] else 1.0)
                F = world // 2 if A else 1
                run_id = f"{strategy}-F{F}-R1-S{2 if A else world}" + (f"-A{A}" if A else "") + f"-rep{rep}"
                out.append(make_result(run_id=run_id, strategy=strategy, A=A, F=F, S=2 if A else world,
                                       world_size=world, tokens_per_s=per_device * world,
                                       tokens_per_s_per_device=per_device, exposed_comm_s=0.01 * world,
                                       energy_source="none: vm: no RAPL package zone under /sys/class/powercap"))
    return out


def test_scaling_table_gives_efficiency_paired_by_seed_against_the_fewest_devices(tmp_path):
    table = scaling_table(_results(), "weak")
    rows = list(csv.DictReader(io.StringIO(table.to_csv())))
    assert [(r["Layout"], r["Devices"]) for r in rows] == [("FL+FSDP A=8", "4"), ("FL+FSDP A=8", "8"),
                                                           ("FSDP", "2"), ("FSDP", "4")]
    assert [float(r["Efficiency"]) for r in rows] == pytest.approx([1.0, 0.8, 1.0, 0.8])
    assert float(rows[1]["Efficiency low"]) == pytest.approx(0.8)  # the same noise on every size: no spread
    assert float(rows[3]["Tokens/s per device mean"]) == pytest.approx(80.0)
    md = table.to_markdown()
    assert "weak scaling: the batch per device is the same at every size" in md
    assert "MFU –: the cluster states no peak_flops." in md
    assert "Energy –: none: vm: no RAPL package zone under /sys/class/powercap" in md
    assert scaling_plot(_results(), "weak", tmp_path / "scaling.png").stat().st_size > 0


@pytest.mark.slow
def test_a_local_strong_scaling_sweep_writes_the_scaling_table_and_plot(tmp_path):
    args = ["sweep=scaling_strong", "sweep.strategies=[fsdp]", "sweep.tp=[1]", "sweep.pp=[1]", "sweep.nodes=[1,2]",
            "sweep.repeats=1", "train.steps=4", "train.eval_every=0", "train.log_every=2", f"results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(slurm_client=False), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep_dir = tmp_path / "local" / "scaling_strong"
    rows = list(csv.DictReader(io.StringIO((sweep_dir / "scaling.csv").read_text())))
    assert [(r["Devices"], r["Batch per device"], r["Efficiency"]) for r in rows][0] == ("2", "4", "1.0")
    assert [(r["Devices"], r["Batch per device"]) for r in rows][1] == ("4", "2")
    measured = RunResult.load(sweep_dir / "fsdp-F1-R1-S4" / "result.json")  # the 2-node run, as the table shows it
    assert measured.exposed_comm_s is not None
    assert float(rows[1]["Exposed comm (ms/step)"]) == pytest.approx(measured.exposed_comm_s * 1e3)
    assert (sweep_dir / "scaling.png").stat().st_size > 0 and "Scaling (strong)" in proc.stdout
    assert "more ranks than cores" in (sweep_dir / "scaling.md").read_text()
    first = (sweep_dir / "scaling.md").read_text()
    report = subprocess.run([sys.executable, "-m", "launcher", *args, "action=report"], capture_output=True,
                            text=True, cwd=ROOT, env=clean_env(slurm_client=False), timeout=300)
    assert report.returncode == 0 and (sweep_dir / "scaling.md").read_text() == first


def test_the_shared_machine_note_names_local_and_testbed_clusters_only():
    """Throughput per device falls with core sharing where every rank runs on one machine: the local executor
    and the SLURM testbed (its nodes are namespaces of one machine); a real cluster gets no such note."""
    from types import SimpleNamespace

    def notes(**cluster):
        return " ".join(scaling_table(_results(), "weak", SimpleNamespace(**cluster)).notes)

    assert "cluster=local: every rank runs on one machine (the local executor)" in \
        notes(name="local", executor="local", network=None)
    assert "cluster=testbed: every rank runs on one machine (the testbed's nodes are network namespaces of it)" in \
        notes(name="testbed", executor="slurm", partition="gpu", network={"subnet": "10.210.0"})
    assert "one machine" not in notes(name="leonardo", executor="slurm", partition="boost_usr_prod", network=None)
