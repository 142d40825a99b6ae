"""Control that controls (issue 57, item 4): action=cancel stops the sweep (CANCELLED, nothing more submitted, no
retry), status reads the sweep's own record rather than the command line, the progress line counts what is done,
and a plan leaves no script of a run it no longer has."""
import contextlib
import io
import json
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from launcher.__main__ import main
from launcher.actions import control
from launcher.actions import run as run_action
from launcher.actions.plan import write_scripts
from launcher.actions.run import Sweeper
from launcher.records.lock import CANCEL, SweepLock, request_cancel
from launcher.settings import compose
from tests.support import clean_env, make_result, steps_logged, wait_for
from tests.test_slurm_states import Scripted

TWO = ["sweep.strategies=[fsdp,fl_fsdp]", "retries=1"]


def _main(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(argv))
    return rc, out.getvalue()


class CancelledWhileRunning(Scripted):
    """The first job is cancelled by action=cancel from another terminal while the launcher waits on it: the
    request reaches the sweep directory, then the job ends (SIGINT to a local controller, scancel on SLURM)."""

    def done(self, job, tasks, polled=None):
        request_cancel(job.run_dir.parent, [job.run_dir.name])
        return super().done(job, tasks, polled)


def test_cancel_stops_the_sweep_records_cancelled_and_submits_nothing_more(tmp_path, monkeypatch):
    settings = compose([*TWO, f"results_dir={tmp_path}"])
    scripted = CancelledWhileRunning(settings.cluster, [("FAILED", False, "KeyboardInterrupt\n"),
                                                        ("COMPLETED", True, "")])
    monkeypatch.setattr(run_action.schedulers, "of", lambda cluster: scripted)
    rc, out = _main(*TWO, f"results_dir={tmp_path}")
    entries = [json.loads(line) for line in (settings.sweep_dir / "manifest.jsonl").read_text().splitlines()]
    assert [(e["run_id"], e["state"], e["attempts"]) for e in entries] == [("fsdp-F1-R1-S4", "CANCELLED", 1)]
    assert entries[0]["reason"] == "cancelled by action=cancel"
    assert scripted.submitted == ["4242"]  # neither the next run nor a retry
    assert rc == 1 and "stopped by action=cancel: 1 run(s) cancelled, 1 not run; the same command resumes it" in out
    assert "retrying" not in out and not (settings.sweep_dir / CANCEL).exists()


def test_action_cancel_asks_the_waiting_launcher_to_stop(tmp_path, capsys):
    """A launcher holds the sweep (its lock): cancel tells it through the sweep directory, even between two runs
    when no job is live, instead of saying there is nothing to cancel."""
    settings = compose(["action=cancel", f"results_dir={tmp_path}"])
    with SweepLock(settings.sweep_dir):
        assert control.cancel(settings, []) == 0
        assert json.loads((settings.sweep_dir / CANCEL).read_text())["runs"] == []
    assert "records them CANCELLED and submits nothing more" in capsys.readouterr().out


def test_the_progress_line_counts_runs_done_not_runs_cancelled_earlier(tmp_path):
    settings = compose([f"results_dir={tmp_path}", "sweep.repeats=2"])
    sweeper = Sweeper(settings)
    ids = ["fsdp-F1-R1-S4-rep1", "fl_fsdp-F2-R1-S2-A2-rep1", "fsdp-F1-R1-S4-rep2", "fl_fsdp-F2-R1-S2-A2-rep2"]
    sweeper.ids, sweeper.total = set(ids), 4
    sweeper.store.record(ids[0], state="CANCELLED", attempts=1)  # a cancelled earlier invocation
    sweeper.store.record(ids[1], state="FAILED", attempts=1)
    sweeper.store.record("fsdp-F1-R1-S8", state="COMPLETED", attempts=1)  # no longer a run of this sweep
    assert "] 0/4 done," in sweeper._progress()
    sweeper.store.record(ids[2], state="COMPLETED", attempts=1)
    assert "] 0/4 done," in sweeper._progress()  # COMPLETED without its result.json is not done
    make_result(run_id=ids[2]).save(settings.sweep_dir / ids[2] / "result.json")
    assert "] 1/4 done," in sweeper._progress()


def test_status_reads_the_sweeps_record_not_the_command_line(tmp_path):
    """A multirun's 4 finished runs, asked about without its -m arguments: 4 COMPLETED, none NOT SUBMITTED."""
    rc, _ = _main("-m", "sweep=smoke", "train.lr=1e-3,1e-4", "action=plan", f"results_dir={tmp_path}")
    assert rc == 0
    sweep = tmp_path / "local" / "smoke"
    ids = [e["run_id"] for e in json.loads((sweep / "plan.json").read_text())["runs"]]
    (sweep / "manifest.jsonl").write_text("".join(json.dumps({"run_id": r, "attempts": 1, "state": "COMPLETED",
                                                              "job_id": str(100 + i)}) + "\n"
                                                  for i, r in enumerate(ids)))
    for r in ids:
        make_result(run_id=r).save(sweep / r / "result.json")
    rc, out = _main("sweep=smoke", "action=status", f"results_dir={tmp_path}")
    assert rc == 0 and "NOT SUBMITTED" not in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:-1]}
    assert rows == dict.fromkeys(ids, "COMPLETED") and len(ids) == 4
    assert out.splitlines()[-1].strip() == "4 completed"


def test_a_plan_removes_the_scripts_of_runs_it_no_longer_has(tmp_path):
    def entry(run_id):
        return SimpleNamespace(run_id=run_id, sbatch=f"#!/bin/bash\n# {run_id}")

    write_scripts(tmp_path, [entry("fsdp-F1-R1-S8"), entry("hsdp-F1-R4-S2")])
    (tmp_path / "scripts" / "notes.txt").write_text("mine")  # not a script: left alone
    written = write_scripts(tmp_path, [entry("hsdp-F1-R4-S2")])
    assert sorted(p.name for p in (tmp_path / "scripts").iterdir()) == ["hsdp-F1-R4-S2.sbatch", "notes.txt"]
    assert written == [tmp_path / "scripts" / "hsdp-F1-R4-S2.sbatch"]


@pytest.mark.slow
def test_action_cancel_stops_a_local_sweep_for_real(tmp_path):
    """Issue 57's case end to end: a local sweep of two runs, action=cancel from another process while the first
    trains. The first is CANCELLED (it was FAILED), the second is never submitted (it was), nothing is retried, and
    status lists both from the sweep's record. The launcher runs as `nohup python -m launcher ... &` leaves it: a
    shell's background job ignores SIGINT, which its local jobs must not inherit (the cancel is their SIGINT)."""
    args = ["sweep=smoke", "model=tiny", "sweep.strategies=[fsdp,fl_fsdp]", "sweep.train.steps=2000", "retries=1",
            f"results_dir={tmp_path}"]
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", *args], env=clean_env(slurm_client=False),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    sweep = tmp_path / "local" / "smoke"
    try:
        wait_for(lambda: steps_logged(sweep / "fsdp-F1-R1-S4") >= 1, "the first logged step",
                 alive=lambda: launcher.poll() is None)
        cancel = subprocess.run([sys.executable, "-m", "launcher", *args, "action=cancel"], capture_output=True,
                                text=True, env=clean_env(slurm_client=False), timeout=300)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert cancel.returncode == 0 and "cancelled fsdp-F1-R1-S4" in cancel.stdout, cancel.stdout + cancel.stderr
    assert "submits nothing more" in cancel.stdout
    assert launcher.returncode == 1, out[-2000:] + err[-2000:]
    assert "stopped by action=cancel: 1 run(s) cancelled, 1 not run" in out
    assert "submitted fl_fsdp" not in out and "retrying" not in out
    entries = [json.loads(line) for line in (sweep / "manifest.jsonl").read_text().splitlines()]
    assert [(e["run_id"], e["state"]) for e in entries] == [("fsdp-F1-R1-S4", "CANCELLED")]
    status = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "action=status",
                             f"results_dir={tmp_path}"], capture_output=True, text=True,
                            env=clean_env(slurm_client=False), timeout=300)
    assert status.stdout.splitlines()[-1].strip() == "1 cancelled, 1 not submitted", status.stdout
