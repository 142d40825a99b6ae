"""bench.gpu_check, the first command on a GPU node, run on CPU ranks: the same entrypoint, specs and checks."""
import pytest

from bench import gpu_check
from bench.gpu_check import layouts, main
from tests import forked
from tests.support import clean_env


def test_layouts_fit_the_ranks():
    assert layouts(1) == {"fsdp": (1, 1, 1)}
    assert layouts(2) == {"fsdp": (1, 1, 2), "hsdp": (1, 2, 1), "fl_fsdp": (2, 1, 1)}
    assert layouts(8)["fl_hsdp"] == (2, 2, 2)


def test_an_unknown_strategy_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--device", "cpu", "--strategies", "fsdp,fl_avg"])
    assert exit.value.code == 2
    assert "--strategies: unknown fl_avg; expected some of fsdp, hsdp, fl_fsdp, fl_hsdp" in capsys.readouterr().err


def test_gpu_check_on_cpu_ranks_runs_every_check(monkeypatch, capsys):
    """Two strategies (the loop is the same for all four, whose layouts test_layouts checks), to keep the suite
    short: every check still runs. Its six torchruns of `-m train` go to ranks forked from a preloaded interpreter
    (tests/forked.py); `python -m bench.gpu_check` is `sys.exit(main())`."""
    def forked_torchrun(spec_path, ranks, env):
        ranks = forked.torchrun("train", str(spec_path), nproc=ranks, env={**clean_env(), **env})
        return ranks.wait(timeout=600), ranks.stderr

    monkeypatch.setattr(gpu_check, "torchrun", forked_torchrun)
    status = main(["--device", "cpu", "--ranks", "4", "--model", "tiny", "--steps", "2", "--seq-len", "16",
                   "--strategies", "fsdp,fl_hsdp"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert not any(line.startswith(("hsdp ", "fl_fsdp ")) for line in lines)
    for strategy, layout in (("fsdp", "(1,1,4)"), ("fl_hsdp", "(2,2,1)")):
        row = next(line for line in lines if line.startswith(strategy + " "))
        assert layout in row and row.endswith("ok")
        assert " ms " in row  # exposed communication, measured on every FSDP-based layout
    assert any(line.startswith("energy: ") for line in lines)
    assert any("losses bitwise equal, ok" in line for line in lines)
    assert lines[-1] == "gpu_check: all checks passed"
