"""bench.gpu_check, the first command on a GPU node, run on CPU ranks: the same entrypoint, specs and checks."""
import subprocess
import sys

from bench.gpu_check import layouts
from tests.support import ROOT, clean_env


def test_layouts_fit_the_ranks():
    assert layouts(1) == {"fsdp": (1, 1, 1)}
    assert layouts(2) == {"fsdp": (1, 1, 2), "hsdp": (1, 2, 1), "fl_fsdp": (2, 1, 1)}
    assert layouts(8)["fl_hsdp"] == (2, 2, 2)


def test_gpu_check_on_cpu_ranks_runs_every_check():
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--ranks", "4", "--model",
                           "tiny", "--steps", "2", "--seq-len", "16"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for strategy, layout in (("fsdp", "(1,1,4)"), ("hsdp", "(1,2,2)"), ("fl_fsdp", "(2,1,2)"), ("fl_hsdp", "(2,2,1)")):
        row = next(line for line in lines if line.startswith(strategy + " "))
        assert layout in row and row.endswith("ok")
        assert " ms " in row  # exposed communication, measured on every FSDP-based layout
    assert any(line.startswith("energy: ") for line in lines)
    assert any("losses bitwise equal, ok" in line for line in lines)
    assert lines[-1] == "gpu_check: all checks passed"
