"""sweep.target=reference: the target is declared from the fsdp runs, which run first, before any other run starts."""
import json
import subprocess
import sys
from datetime import datetime

import pytest

from launcher.records.target import ReferenceTarget, judged, resolution_note
from launcher.report.results import load_results
from launcher.settings import compose
from launcher.sweep import expand
from tests.support import clean_env, make_result
from train.contract.common import ConfigError
from train.contract.result import RunResult
from train.contract.spec import RunSpec


def _runs(*overrides):
    settings = compose(["sweep=smoke", "model=tiny", *overrides])
    return settings, expand(settings)


def test_one_target_one_reference_configuration(tmp_path):
    settings, runs = _runs("sweep.target=reference", "train.target_ppl=9")
    with pytest.raises(ConfigError, match="train.target_ppl=9 declares one too: set only one"):
        ReferenceTarget(tmp_path, runs, settings.train)
    settings, runs = _runs("sweep.target=reference", "sweep.strategies=[fl_fsdp]")
    with pytest.raises(ConfigError, match="the sweep has none: add fsdp to sweep.strategies"):
        ReferenceTarget(tmp_path, runs, settings.train)
    settings, runs = _runs("sweep.target=reference", "sweep.nodes=[2,4]")
    with pytest.raises(ConfigError, match="the sweep runs it on 2, 4 nodes"):
        ReferenceTarget(tmp_path, runs, settings.train)
    with pytest.raises(ConfigError, match="sweep.target must be reference or null, got 'fsdp'"):
        compose(["sweep=smoke", "sweep.target=fsdp"])


def test_declared_target_is_the_worst_reference_and_enters_only_the_others_specs(tmp_path):
    settings, runs = _runs("sweep.target=reference", "sweep.repeats=2")
    target = ReferenceTarget(tmp_path, runs, settings.train)
    assert target.declared is None and len(target.reference) == 2 and len(target.others) == 2
    reference = [make_result(run_id=r.run_id, eval_ppl=ppl) for r, ppl in zip(target.reference, (40.0, 45.0))]
    assert target.declare(reference) == 45.0
    assert [r.spec.train.target_ppl for r in runs] == [None if r.spec.layout.strategy == "fsdp" else 45.0 for r in runs]
    again = ReferenceTarget(tmp_path, expand(settings), settings.train)  # a rerun reads it back, unchanged
    assert again.declared == 45.0 and all(r.spec.train.target_ppl == 45.0 for r in again.others)
    with pytest.raises(Exception, match="did not finish"):
        target.declare(reference[:1])


def test_report_judges_the_reference_runs_from_their_eval_history(tmp_path):
    (tmp_path / "target.json").write_text(json.dumps({"target_ppl": 45.0}))
    fsdp = make_result(eval_history=[[4, 2.0, 60.0], [8, 4.0, 44.0]], eval_ppl=44.0)
    other = make_result(run_id="fl_fsdp-F2-R1-S2-A2", target_ppl=45.0, time_to_target_s=1.5, steps_to_target=4)
    judged_fsdp, judged_other = judged(tmp_path, [fsdp, other])
    assert (judged_fsdp.target_ppl, judged_fsdp.time_to_target_s, judged_fsdp.steps_to_target) == (45.0, 4.0, 8)
    assert judged_other == other  # its own spec's target, judged by the run itself
    assert judged(tmp_path / "none", [fsdp]) == [fsdp]


def test_too_few_evaluations_for_a_target_are_said():
    settings, _ = _runs("sweep.target=reference", "train.steps=32", "train.eval_every=4")
    assert "evaluates 8 time(s)" in resolution_note(settings) and "train.eval_every <= 2" in resolution_note(settings)
    assert resolution_note(_runs("sweep.target=reference", "train.steps=32", "train.eval_every=2")[0]) is None
    assert resolution_note(_runs()[0]) is None  # no target: nothing to resolve


@pytest.mark.slow
def test_reference_runs_first_then_the_others_with_the_declared_target(tmp_path):
    args = ["sweep=smoke", "model=tiny", "sweep.target=reference", "train.eval_every=2", f"results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=clean_env(slurm_client=False), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert out.index("fsdp-F1-R1-S4: COMPLETED") < out.index("target declared") < out.index("submitted fl_fsdp")
    sweep_dir = tmp_path / "local" / "smoke"
    declared = json.loads((sweep_dir / "target.json").read_text())
    fsdp = RunResult.load(sweep_dir / "fsdp-F1-R1-S4" / "result.json")
    fl = RunResult.load(sweep_dir / "fl_fsdp-F2-R1-S2-A2" / "result.json")
    assert declared["target_ppl"] == fsdp.eval_ppl and declared["runs"] == {fsdp.run_id: fsdp.eval_ppl}
    assert datetime.fromisoformat(declared["declared_at"]) <= datetime.fromisoformat(fl.started_at)
    assert RunSpec.load(sweep_dir / fl.run_id / "spec.json").train.target_ppl == fsdp.eval_ppl == fl.target_ppl
    rows = {r.run_id: r for r in judged(sweep_dir, load_results(sweep_dir))}
    assert rows[fsdp.run_id].time_to_target_s is not None  # its own worst final eval: reached by the end
    assert "Time to target (s)" in (sweep_dir / "table3.md").read_text()
    again = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                           env=clean_env(slurm_client=False), timeout=900)
    assert again.returncode == 0 and again.stdout.count("skipped") == 2 and "target declared" not in again.stdout
