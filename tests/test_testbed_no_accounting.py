"""The testbed without slurmdbd: sacct knows no job, and the launcher must still see a job end.

A module of its own, so that it brings up its own testbed after test_testbed.py's has gone down,
whichever tests of that module ran.
"""
import json
import subprocess
import sys

import pytest

from tests.support import ROOT, wait_for
from tests.test_testbed import LAB, _running_testbed, lab

# Under pytest-xdist (-n) every testbed test runs on one worker: one testbed at a time on a machine.
pytestmark = pytest.mark.xdist_group("testbed")


@pytest.fixture
def testbed_without_accounting():
    yield from _running_testbed("--no-accounting")


@pytest.mark.slow
def test_job_killed_outside_python_without_accounting_does_not_hang(testbed_without_accounting, tmp_path):
    assert "accounting storage is disabled" in lab("sacct", "-j", "1").stderr.lower()
    launcher = subprocess.Popen([LAB, sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny",
                                 "retries=0", "poll_s=1", "sweep.strategies=[fsdp]", "train.steps=100000",
                                 f"results_dir={tmp_path}"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "RUNNING" in lab("squeue", "-h", "-o", "%T").stdout, "the job to start", 120,
             alive=lambda: launcher.poll() is None)
    assert lab("scancel", "1").returncode == 0
    out, err = launcher.communicate(timeout=120)  # submitit alone would poll sacct forever
    assert launcher.returncode == 1, out + err
    assert "1 of 1 run(s) failed" in out
    entry = json.loads((tmp_path / "testbed" / "smoke" / "manifest.jsonl").read_text())
    assert entry["state"] == "FAILED" and entry["scheduler_state"] in ("CANCELLED", "VANISHED")
