"""Hydra's multirun: swept keys become axes of one sweep (one plan, one manifest, run ids carrying the values,
a table column per swept key), parsed by Hydra's own override parser."""
import contextlib
import io
import json
import subprocess
import sys

import pytest

from launcher import multirun
from launcher.__main__ import main
from tests.support import ROOT, clean_env
from train.contract.common import ConfigError
from train.contract.layout import Layout
from train.contract.result import RunResult
from train.contract.spec import config_name


def test_split_parses_hydras_sweep_syntax():
    fixed, axes = multirun.split(["sweep=smoke", "train.lr=1e-3,1e-4", "train.seed=range(1,3)",
                                  "model=glob([t*,m*])", "train.betas=[0.9,0.95]"])
    assert fixed == ["sweep=smoke", "train.betas=[0.9,0.95]"]
    assert [(a.key, a.values) for a in axes] == [("train.lr", ["0.001", "0.0001"]), ("train.seed", ["1", "2"]),
                                                 ("model", ["mini", "tiny"])]
    assert len(multirun.points(axes)) == 8
    point = {"train.lr": "0.001", "train.seed": "1", "model": "tiny"}
    assert config_name(Layout("fsdp", 1, 1, 2), point) == "fsdp-F1-R1-S2-lr0.001-seed1-modeltiny"
    for argv, message in ((["cluster=local,testbed"], "cluster cannot be swept with -m"),
                          (["results_dir=a,b"], "results_dir cannot be swept"),
                          (["train.lr=1,2", "train.lr=3,4"], "train.lr is swept twice"),
                          (["train.lr=[1,"], r"cannot read the override 'train.lr=\[1,': no viable alternative")):
        with pytest.raises(ConfigError, match=message):
            multirun.split(argv)


def test_plan_of_a_multirun_is_one_plan_with_every_point(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["-m", "sweep=smoke", "train.lr=1e-3,1e-4", "action=plan", f"results_dir={tmp_path}"]) == 0
    plan = json.loads((tmp_path / "local" / "smoke" / "plan.json").read_text())
    assert [e["run_id"] for e in plan["runs"]] == ["fsdp-F1-R1-S4-lr0.001", "fl_fsdp-F2-R1-S2-A2-lr0.001",
                                                   "fsdp-F1-R1-S4-lr0.0001", "fl_fsdp-F2-R1-S2-A2-lr0.0001"]
    assert [e["train"]["lr"] for e in plan["runs"]] == [0.001, 0.001, 0.0001, 0.0001]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["sweep=smoke", "train.lr=1e-3,1e-4", "action=plan", f"results_dir={tmp_path}"]) == 2
    assert "only in a multirun: python -m launcher -m ... train.lr=1e-3,1e-4" in err.getvalue()


@pytest.mark.parametrize("argv, message, works", [
    (["sweep.A=8,16"], "sweep.A=8,16: sweep.A is one of the sweep's own axes and takes its values as one list: "
                       "sweep.A=[8,16] (no -m)", "sweep.A=[8,16]"),
    (["-m", "sweep.A=8,16"], "sweep.A cannot be swept with -m: it is one of the sweep's own axes and takes its "
                             "values as one list: sweep.A=[8,16] (with or without -m)", "sweep.A=[8,16]"),
    (["-m", "sweep.strategies=fsdp,hsdp"], "takes its values as one list: sweep.strategies=[fsdp,hsdp]",
     "sweep.strategies=[fsdp,hsdp]"),
    (["cluster.nodes=2,4"], "cluster.nodes takes one value; a multirun (-m) sweeps only train, model, data keys",
     None),
    (["-m", "cluster=local,testbed"], "-m sweeps train.*, model or data keys (python -m launcher -m train.lr=", None),
])
def test_multirun_guidance_names_the_form_that_works_and_never_sends_you_back(argv, message, works, tmp_path):
    """Issue 57: `sweep.A=8,16` sent users to -m, and -m sent them back; each message now names what works, and
    that works, with or without -m."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main([*argv, "action=plan", f"results_dir={tmp_path}"]) == 2
    assert message in err.getvalue()
    for flags in (([], ["-m"]) if works else ()):
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([*flags, works, "train.eval_every=0", "action=plan",
                         f"results_dir={tmp_path / str(len(flags))}"]) == 0


@pytest.mark.slow
def test_multirun_runs_each_value_and_tables_it(tmp_path):
    args = ["-m", "sweep=smoke", "sweep.strategies=[fsdp]", "train.lr=1e-2,1e-3", f"results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=ROOT,
                          env=clean_env(slurm_client=False), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep_dir = tmp_path / "local" / "smoke"
    manifest = [json.loads(line) for line in (sweep_dir / "manifest.jsonl").read_text().splitlines()]
    assert sorted({m["run_id"] for m in manifest}) == ["fsdp-F1-R1-S4-lr0.001", "fsdp-F1-R1-S4-lr0.01"]
    result = RunResult.load(sweep_dir / "fsdp-F1-R1-S4-lr0.01" / "result.json")
    assert result.axes == {"train.lr": "0.01"}
    table = (sweep_dir / "table3.md").read_text()
    assert "| Strategy | (F,R,S) | A | train.lr |" in table
    assert "| FSDP | (1,1,4) | – | 0.001 |" in table and "| FSDP | (1,1,4) | – | 0.01 |" in table
    again = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=ROOT,
                           env=clean_env(slurm_client=False), timeout=900)
    assert again.returncode == 0 and again.stdout.count("skipped") == 2
