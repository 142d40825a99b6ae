"""sbatch's refusal is one line carrying SLURM's own message, exit 2; only a busy controller is tried again."""
import subprocess
import sys

import pytest

from tests.support import ROOT, clean_env

FIXTURES = ROOT / "tests" / "fixtures" / "slurm-22.05.8"


def _launch(tmp_path, sbatch_stderr: str):
    bin_dir, snap = tmp_path / "bin", tmp_path / "snap"
    bin_dir.mkdir()
    snap.mkdir()
    (snap / "topology.txt").write_text((FIXTURES / "show_topology.txt").read_text())
    (snap / "nodes.txt").write_text((FIXTURES / "show_node_oneliner.txt").read_text())
    tools = {"sbatch": f"echo sbatch >> {tmp_path}/sbatch.calls\nprintf '{sbatch_stderr}' >&2\nexit 1\n",
             "srun": "exit 0\n", "scontrol": "echo 'scontrol: error: no controller here' >&2\nexit 1\n"}
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(0o755)
    env = clean_env()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "cluster=leonardo",
                           f"cluster.snapshot={snap}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
                           f"results_dir={tmp_path / 'results'}"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    return proc, (tmp_path / "sbatch.calls").read_text().count("sbatch")


@pytest.mark.parametrize("stderr, message, tries", [
    ("sbatch: error: invalid partition specified: gpux\\nsbatch: error: Batch job submission failed\\n",
     "sbatch refused fsdp-F1-R1-S8: sbatch: error: invalid partition specified: gpux", 1),
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\\n",
     "sbatch refused fsdp-F1-R1-S8: sbatch: error: Batch job submission failed: Socket timed out", 3),
])
@pytest.mark.slow
def test_sbatch_refusal_is_one_line_with_slurms_message(tmp_path, stderr, message, tries):
    proc, calls = _launch(tmp_path, stderr)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"fedshard: error: {message}"), proc.stderr
    assert calls == tries  # a wrong partition fails the same way again; a busy controller may not
    assert proc.stdout.count("trying again in") == tries - 1
    # a run that never started leaves nothing behind: no run directory, no registered prediction, no submission
    sweep = tmp_path / "results" / "leonardo" / "smoke"
    assert not list(sweep.glob("*/prediction.json")) and not list(sweep.glob("*/spec.json"))
    assert not list(sweep.rglob("*.pkl")) and not (sweep / "fsdp-F1-R1-S8").exists()
