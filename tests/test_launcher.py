"""The launcher: layouts as in the paper, plan.json and sbatch text, a local sweep (bad input: test_bad_input.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from launcher.settings import compose
from launcher.sweep import expand
from tests.support import children, clean_env, steps_logged, wait_for
from train.contract.result import RunResult

GOLDEN = Path(__file__).parent / "golden"


def _launcher(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=kw.pop("timeout", 900), **kw)


def _env(**extra):
    return clean_env(slurm_client=False, **extra)


def _layouts(overrides):
    return [(L.strategy, L.F, L.R, L.S, L.A) for L in (r.spec.layout for r in expand(compose(overrides)))]


def test_leonardo_paper_table3_plan_is_the_papers_four_runs(tmp_path):
    proc = _launcher("sweep=paper_table3", "cluster=leonardo", "action=plan", f"results_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "leonardo" / "paper_table3" / "plan.json").read_text())
    got = [(r["strategy"], r["F"], r["R"], r["S"], r["A"]) for r in plan["runs"]]
    assert got == [("fsdp", 1, 1, 512, None), ("hsdp", 1, 128, 4, None), ("fl_fsdp", 128, 1, 4, 8),
                   ("fl_hsdp", 16, 8, 4, 8)]
    for r in plan["runs"]:
        assert r["model"] == {"preset": "llama3_8b"} and len(r["nodes"]) == 128 and r["model_params"] == 8_030_261_248
        assert len(r["hostfile"]) == 512 and len(r["coords"]) == 512 and r["hierarchy_ok"]
        assert set(r["bandwidth"]) == {"B_T", "B_P", "B_S", "B_R", "B_F"} and r["predicted_comm_s"] > 0
        assert r["train"] == {"steps": 64, "seq_len": 2048, "batch_per_rank": 2, "lr": 3e-4, "precision": "paper"}
        assert r["resources"]["ntasks_per_node"] == 4 and r["resources"]["gpus_per_node"] == 4
    assert "fl_hsdp-F16-R8-S4-A8" in proc.stdout
    ratios = {r["strategy"]: r["predicted_ratio_to_fsdp"] for r in plan["runs"]}
    assert ratios["fsdp"] == 1 and ratios["fl_fsdp"] < min(ratios["fl_hsdp"], ratios["hsdp"]) and ratios["hsdp"] < 1
    # The ideal Leonardo tree (10-node L1 switches, 11.25 GB/s per GPU above them) cannot hold 8-node replica
    # groups under single switches on 128 nodes: B_R = B_F, and FL+HSDP is predicted to lose its edge.
    paper_fl_hsdp = plan["runs"][3]
    assert paper_fl_hsdp["bandwidth"]["B_R"] == paper_fl_hsdp["bandwidth"]["B_F"] == 11.25e9
    # fastest first by the step-time model, the layouts that do not fit a 64 GiB A100 last
    fits = [row["fits"] for row in plan["ranking"]]
    assert fits == sorted(fits, reverse=True)
    steps = [row["predicted_step_s"] for row in plan["ranking"] if row["fits"]]
    assert len(steps) > 4 and steps == sorted(steps)
    assert all(row["speedup_over_fsdp"] > 0 for row in plan["ranking"])


def test_paper_preset_trains_the_authors_tokens_with_whole_fedavg_periods():
    """64 steps x 512 GPUs x 2 x 2048 tokens: the authors' one epoch of 65,536 sequences, a multiple of A = 8."""
    settings = compose(["sweep=paper_table3", "cluster=leonardo"])
    train = settings.train
    world = settings.cluster.nodes * settings.cluster.gpus_per_node
    assert world * train.batch_per_rank == 1024 and train.steps * world * train.batch_per_rank == 65_536
    assert all(train.steps % A == 0 for A in settings.sweep.A)
    assert train.checkpoint_every % 8 == 0 and train.steps * 1024 * train.seq_len == 134_217_728


def test_sbatch_text_matches_golden_file(tmp_path):
    assert _launcher("sweep=paper_table3", "cluster=leonardo", "action=plan", f"results_dir={tmp_path}",
                     "cluster.account=my_account").returncode == 0
    run = json.loads((tmp_path / "leonardo" / "paper_table3" / "plan.json").read_text())["runs"][3]
    text = run["sbatch"].replace(str(tmp_path), "RESULTS").replace(sys.executable, "PYTHON")
    assert text == (GOLDEN / "leonardo_fl_hsdp.sbatch").read_text()


def test_local_cluster_scales_the_paper_layouts_to_4_nodes_of_2():
    assert _layouts(["sweep=paper_table3"]) == [("fsdp", 1, 1, 8, None), ("hsdp", 1, 4, 2, None),
                                                ("fl_fsdp", 4, 1, 2, 8), ("fl_hsdp", 2, 2, 2, 8)]


def test_exclusions_repeats_and_axes():
    runs = expand(compose(["sweep=agg_frequency", "sweep.A=[1,4]", "sweep.repeats=2",
                           "sweep.exclude=[{strategy: fl_hsdp, A: 1}]"]))
    ids = [r.run_id for r in runs]
    # round-robin: every configuration's first repeat before any second one, so drift spreads evenly; repeat 1
    # keeps the run's own id
    assert ids == ["fl_fsdp-F4-R1-S2-A1", "fl_fsdp-F4-R1-S2-A4", "fl_hsdp-F2-R2-S2-A4",
                   "fl_fsdp-F4-R1-S2-A1-rep2", "fl_fsdp-F4-R1-S2-A4-rep2", "fl_hsdp-F2-R2-S2-A4-rep2"]
    seeds = [r.spec.train.seed for r in runs]
    assert seeds[:3] == [seeds[0]] * 3 and seeds[3:] == [seeds[0] + 1] * 3  # repeat k: seed + k - 1, paired


SMOKE = ["sweep=smoke", "model=tiny"]


@pytest.mark.slow
def test_smoke_sweep_end_to_end_then_every_run_skipped(tmp_path):
    proc = _launcher(*SMOKE, f"results_dir={tmp_path}", "wandb.enabled=true", "progress_s=0.5",
                     env=_env(WANDB_API_KEY=""))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep_dir = tmp_path / "local" / "smoke"
    manifest = [json.loads(line) for line in (sweep_dir / "manifest.jsonl").read_text().splitlines()]
    assert {m["run_id"]: m["state"] for m in manifest} == {"fsdp-F1-R1-S4": "COMPLETED",
                                                           "fl_fsdp-F2-R1-S2-A2": "COMPLETED"}
    for name in ("table3.md", "table3.csv", "table3.tex", "table4.md", "table4.csv", "table4.tex",
                 "ppl_vs_time.png", "phases.png"):
        assert (sweep_dir / name).stat().st_size > 0, name
    table3 = (sweep_dir / "table3.md").read_text()
    assert "| FSDP | (1,1,4) |" in table3 and "| FL+FSDP | (2,1,2) | 2 |" in table3
    assert "Table 3" in proc.stdout and "Table 4" in proc.stdout
    assert "cluster=local: every rank ran on this one machine" in table3  # ratios here do not test the claim
    assert f"outputs in {sweep_dir}/: table3.md, table3.csv, table3.tex, table4.md" in proc.stdout
    assert "per run: <run_id>/result.json, metrics.jsonl, evals.jsonl, spec.json, prediction.json" in proc.stdout
    result = RunResult.load(sweep_dir / "fl_fsdp-F2-R1-S2-A2" / "result.json")
    assert result.aggregations == 3 and result.world_size == 4
    assert result.baseline_ppl == pytest.approx(result.data["baseline_ppl"]) and result.baseline_ppl > result.floor_ppl
    for run_id in ("fsdp-F1-R1-S4", "fl_fsdp-F2-R1-S2-A2"):  # each prediction registered before its run started
        registered = json.loads((sweep_dir / run_id / "prediction.json").read_text())
        started = RunResult.load(sweep_dir / run_id / "result.json").started_at
        assert registered["run_id"] == run_id and registered["placement"] == "topology"
        assert datetime.fromisoformat(registered["predicted_at"]) <= datetime.fromisoformat(started)
        assert registered["compute_source"].startswith("unknown") and "commit" in registered  # None: no git on PATH
    # compute unknown on cluster=local without a probe: no step-time prediction shown; no placement table either
    assert not (sweep_dir / "prediction.md").exists() and not (sweep_dir / "placement.md").exists()
    assert len(list((sweep_dir / "wandb").glob("offline-run-*"))) == 2  # offline: nothing left the machine
    assert f"upload them with: wandb sync {sweep_dir / 'wandb'}/offline-run-*" in proc.stdout
    assert re.search(r"\[\dm\d\ds\] [01]/2 done, running: \S+ (step \d/6|starting), queued: [01]; ", proc.stdout)
    assert not (sweep_dir / ".lock").exists()  # removed when the launcher ended

    again = _launcher(*SMOKE, f"results_dir={tmp_path}")
    assert again.returncode == 0
    assert again.stdout.count("skipped") == 2 and "submitted" not in again.stdout
    assert "Table 3" in again.stdout


@pytest.mark.slow
def test_ctrl_c_leaves_manifest_consistent_and_rerun_resumes(tmp_path):
    # A suite started in the background by a shell without job control inherits SIGINT ignored, and Python
    # keeps it ignored: the launcher gets the disposition a terminal would give it.
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *SMOKE, f"results_dir={tmp_path}"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stdout.readline()
    assert first.startswith("submitted fsdp-F1-R1-S4"), first
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err  # the controller's goes to its log
    manifest = [json.loads(line) for line in (tmp_path / "local" / "smoke" / "manifest.jsonl").read_text().splitlines()]
    assert [(m["run_id"], m["state"]) for m in manifest] == [("fsdp-F1-R1-S4", "CANCELLED")]
    assert not (tmp_path / "local" / "smoke" / "fsdp-F1-R1-S4" / "result.json").exists()
    again = _launcher(*SMOKE, f"results_dir={tmp_path}")
    assert again.returncode == 0, again.stderr
    assert "submitted fsdp-F1-R1-S4 as job" in again.stdout and "(attempt 2)" in again.stdout


@pytest.mark.slow
def test_a_deterministic_failure_is_reported_and_not_retried(tmp_path, tiny_tokenizer):
    """The data exists (the launcher checks paths before submitting) but holds no text: the job fails with a
    DataError, which would fail again, so it is not retried."""
    (tmp_path / "empty.txt").write_text("")
    proc = _launcher(*SMOKE, "data=text", f"data.paths=[{tmp_path / 'empty.txt'}]", f"data.tokenizer={tiny_tokenizer}",
                     "sweep.strategies=[fsdp]", "retries=1", f"results_dir={tmp_path}")
    assert proc.returncode == 1, proc.stderr
    assert "not retrying fsdp-F1-R1-S4: it would fail the same way" in proc.stdout
    assert "retrying 1" not in proc.stdout and "1 of 1 run(s) failed" in proc.stdout
    entry = json.loads((tmp_path / "local" / "smoke" / "manifest.jsonl").read_text())
    assert entry["state"] == "FAILED" and entry["attempts"] == 1 and entry["cluster"] == "local"
    assert "DataError" in entry["reason"] and "yields 0 tokens" in entry["reason"]


@pytest.mark.slow
def test_a_killed_task_is_retried_and_the_run_completes(tmp_path):
    """A rank killed by SIGKILL (as a failing node would) can pass on a second try: it is retried."""
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", *SMOKE, "sweep.strategies=[fsdp]", "retries=1",
                                 "sweep.train.steps=150", f"results_dir={tmp_path}"], env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    manifest, run_dir = tmp_path / "local" / "smoke" / "manifest.jsonl", tmp_path / "local" / "smoke" / "fsdp-F1-R1-S4"
    wait_for(lambda: steps_logged(run_dir) >= 1 and manifest.exists(), "the first logged step",
             alive=lambda: launcher.poll() is None)
    job_pid = int(json.loads(manifest.read_text())["job_id"])  # the local executor's job id is its pid
    (task,) = children(job_pid)  # the one task, which forked the ranks
    os.kill(children(task)[-1], signal.SIGKILL)
    out, err = launcher.communicate(timeout=900)
    assert launcher.returncode == 0, err[-3000:]
    assert "retrying 1 failed run(s)" in out and "not retrying" not in out
    entry = json.loads(manifest.read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2
    assert "reason" not in entry and "scheduler_state" not in entry  # the first attempt's failure is history


@pytest.mark.slow
def test_two_launchers_cannot_share_a_sweep_directory(tmp_path):
    one_run = [*SMOKE, "sweep.strategies=[fsdp]", f"results_dir={tmp_path}"]  # the lock is the sweep's, whatever runs
    first = subprocess.Popen([sys.executable, "-m", "launcher", *one_run], env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert first.stdout.readline().startswith("submitted ")  # the first one holds the lock now
    second = _launcher(*one_run)
    assert second.returncode == 2 and "another launcher (pid" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert first.wait(timeout=600) == 0  # and the first one was not disturbed


def test_a_bug_keeps_its_traceback_and_is_not_reported_as_bad_input(tmp_path, monkeypatch, capsys):
    """Only fedshard's own errors become `fedshard: error:` lines; a ValueError from a bug propagates."""
    import launcher.actions.plan
    from launcher.__main__ import main

    def broken(settings, runs=None):
        raise ValueError("a bug in the planner")

    monkeypatch.setattr(launcher.actions.plan, "plan", broken)
    with pytest.raises(ValueError, match="a bug in the planner"):
        main(["action=plan", f"results_dir={tmp_path}"])
    assert "fedshard: error" not in capsys.readouterr().err


def test_sweep_lock_is_exclusive_and_removed_on_exit(tmp_path):
    from launcher.records.lock import SweepLock
    from train.contract.common import StateError

    with SweepLock(tmp_path) as held:
        assert (tmp_path / ".lock").read_text() == f"pid {os.getpid()}"
        with pytest.raises(StateError, match=f"another launcher \\(pid {os.getpid()}\\) is running on {tmp_path}"):
            SweepLock(tmp_path).__enter__()
        # A file swapped under the holder (as when it is removed and re-created) is not the one it locked.
        (tmp_path / ".lock").unlink()
        assert not held._still_ours()
    assert not (tmp_path / ".lock").exists()
    with SweepLock(tmp_path):  # and the directory can be locked again
        pass
