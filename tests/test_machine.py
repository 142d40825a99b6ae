"""Which machine ran it, and results that are yours or labelled (issue 54 item 7, issue 57 item 2): every result.json
and probe.json names its machine (torch-free, the host name only as a digest); an ordinary run writes outside the
checkout's committed results/; a run reused from another machine, or from one not recorded, says so."""
import contextlib
import io
import json
import shutil
import socket
import subprocess
import sys

import pytest

from launcher.__main__ import main
from launcher.actions.run import Sweeper
from launcher.settings import compose
from tests.support import ROOT, make_result
from train.contract import machine
from train.contract.result import RunResult

FIELDS = {"host", "cpu", "cores", "cores_usable", "memory_bytes", "kernel", "load_avg", "python", "torch",
          "fedshard", "commit", "gpu"}


def test_the_machine_is_described_without_torch_and_without_its_name():
    code = ("import json, sys; from train.contract.machine import describe; d = describe(); "
            "print(json.dumps(d)); assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert set(described) == FIELDS
    assert described["host"] == machine.host_digest() and len(described["host"]) == 12
    assert socket.gethostname() not in proc.stdout  # a digest, not the name
    assert described["cores"] >= 1 and described["memory_bytes"] > 0 and len(described["load_avg"]) == 3
    assert described["torch"] and described["kernel"] and described["python"] == sys.version.split()[0]
    assert described["commit"] is None or len(described["commit"].removesuffix("-dirty")) == 40
    assert machine.host_digest("tb1") == machine.host_digest("tb1") != machine.host_digest("tb2")


def test_a_result_records_its_machine_and_an_old_result_loads_without_one(tmp_path):
    with_machine = make_result(machine=machine.describe())
    with_machine.save(tmp_path / "new.json")
    assert RunResult.load(tmp_path / "new.json").machine == with_machine.machine
    old = make_result().to_dict()
    del old["machine"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert RunResult.load(tmp_path / "old.json").machine is None


def test_the_probe_summary_keeps_its_machine():
    from launcher.actions.probe import summarise, table
    from launcher.placement import topology

    settings = compose(["results_dir=/tmp"])
    tree = topology.to_json(topology.virtual(settings.cluster)[0])
    raw = {"backend": "gloo", "hosts": ["node1", "node1"], "levels": [], "barrier_s": 1e-4, "compute": [],
           "layouts": [], "machine": machine.describe()}
    probe = summarise(raw, tree)
    assert probe["machine"] == raw["machine"]
    assert f"machine (rank 0): {machine.label(raw['machine'])}" in table(probe)
    assert summarise({k: v for k, v in raw.items() if k != "machine"}, tree)["machine"] is None  # an older raw file


def test_the_default_results_dir_is_outside_the_checkout(monkeypatch):
    """`python -m launcher sweep=...` in the checkout used to write into its committed results/ tree."""
    monkeypatch.chdir(ROOT)
    results_dir = compose(["sweep=batch_control_small"]).results_dir
    assert not results_dir.is_relative_to(ROOT), results_dir
    assert results_dir == (machine.Path.home() / "fedshard-results").resolve()


def test_the_committed_runs_reused_are_labelled_as_not_this_machines(tmp_path):
    """Issue 57's case: the committed batch_control_small, its 3 runs finished, run again (here in a copy): each
    skip and the tables say that the numbers came from a machine the results do not record. (Its first repeat is
    named as runs are named since 2026-12-06, without -rep1, so that none is trained here.)"""
    sweep = tmp_path / "local" / "batch_control_small"
    shutil.copytree(ROOT / "results" / "local" / "batch_control_small", sweep)
    (sweep / "fsdp-F1-R1-S8-rep1").rename(sweep / "fsdp-F1-R1-S8")
    (sweep / "manifest.jsonl").write_text((sweep / "manifest.jsonl").read_text().replace('"fsdp-F1-R1-S8-rep1"',
                                                                                         '"fsdp-F1-R1-S8"'))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["sweep=batch_control_small", f"results_dir={tmp_path}"]) == 0
    text = out.getvalue()
    for run_id in ("fsdp-F1-R1-S8", "fsdp-F1-R1-S8-rep2", "fsdp-F1-R1-S8-rep3"):
        assert (f"skipped {run_id}: finished earlier on a machine not recorded (its result.json has no "
                f"`machine`): its numbers are reused, not measured here") in text
    assert "note: 3 of the 3 run(s) in these tables finished on another machine or one not recorded" in text


@pytest.mark.parametrize("where", ["here", "elsewhere", "ran here"])
def test_a_run_finished_on_this_machine_is_not_labelled(tmp_path, where, capsys):
    from launcher.actions.plan import plan

    settings = compose(["sweep.strategies=[fsdp]", f"results_dir={tmp_path}"])
    planned, _ = plan(settings, echo=False)
    run_id = planned[0].run.run_id
    other = {**machine.describe(), "host": machine.host_digest("another-host"), "cpu": "AMD EPYC 7763"}
    made = {"here": None, "elsewhere": other, "ran here": machine.describe()}[where]
    make_result(run_id=run_id, machine=made).save(settings.sweep_dir / run_id / "result.json")
    sweeper = Sweeper(settings)
    sweeper.store.record(run_id, state="COMPLETED", attempts=1,
                         **({"submitted_from": machine.host_digest()} if where == "here" else {}))
    sweeper.run(planned)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("skipped"))
    if where == "elsewhere":
        assert line == (f"skipped {run_id}: finished earlier on another machine ({machine.label(other)}): its numbers "
                        f"are reused, not measured here")
        assert f"AMD EPYC 7763, {other['cores']} cores" in line and f"host {other['host']}" in line
    else:
        assert line == f"skipped {run_id}: finished earlier"


@pytest.mark.slow
def test_the_trainer_writes_its_machine_into_result_json(tmp_path):
    from tests.support import uninterrupted

    result = uninterrupted({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "out_dir": str(tmp_path / "run"),
                            "model": {"preset": "tiny"}, "train": {"steps": 2, "seq_len": 16, "log_every": 1}})
    written = RunResult.load(tmp_path / "run" / "result.json").machine
    assert written == result.machine and set(written) == FIELDS
    assert written["host"] == machine.host_digest() and written["gpu"] is None and written["torch"]
