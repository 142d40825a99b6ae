"""bench.gpu_check, the first command on a GPU node, run on CPU ranks: the same entrypoint, specs and checks."""
import subprocess
import sys

import pytest

from bench.gpu_check import layouts, main
from tests.support import ROOT, clean_env


def test_layouts_fit_the_ranks():
    assert layouts(1) == {"fsdp": (1, 1, 1)}
    assert layouts(2) == {"fsdp": (1, 1, 2), "hsdp": (1, 2, 1), "fl_fsdp": (2, 1, 1)}
    assert layouts(8)["fl_hsdp"] == (2, 2, 2)


def test_an_unknown_strategy_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--device", "cpu", "--strategies", "fsdp,fl_avg"])
    assert exit.value.code == 2
    assert "--strategies: unknown fl_avg; expected some of fsdp, hsdp, fl_fsdp, fl_hsdp" in capsys.readouterr().err


def test_gpu_check_on_cpu_ranks_runs_every_check():
    """Two strategies (the loop is the same for all four, whose layouts test_layouts checks), to keep the suite
    short: every check still runs."""
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--ranks", "4", "--model",
                           "tiny", "--steps", "2", "--seq-len", "16", "--strategies", "fsdp,fl_hsdp"],
                          cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert not any(line.startswith(("hsdp ", "fl_fsdp ")) for line in lines)
    for strategy, layout in (("fsdp", "(1,1,4)"), ("fl_hsdp", "(2,2,1)")):
        row = next(line for line in lines if line.startswith(strategy + " "))
        assert layout in row and row.endswith("ok")
        assert " ms " in row  # exposed communication, measured on every FSDP-based layout
    assert any(line.startswith("energy: ") for line in lines)
    assert any("losses bitwise equal, ok" in line for line in lines)
    assert lines[-1] == "gpu_check: all checks passed"
