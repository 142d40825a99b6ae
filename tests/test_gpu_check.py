"""bench.gpu_check, the first command on a GPU node, run on CPU ranks: the same entrypoint, specs and checks."""
import json
from pathlib import Path

import pytest

from bench import gpu_accept, gpu_check, gpu_job
from bench.gpu_check import layouts, main
from tests import forked
from tests.support import clean_env


def test_layouts_fit_the_ranks():
    assert layouts(1) == {"fsdp": (1, 1, 1)}
    assert layouts(2) == {"fsdp": (1, 1, 2), "hsdp": (1, 2, 1), "fl_fsdp": (2, 1, 1)}
    assert layouts(8)["fl_hsdp"] == (2, 2, 2)


def test_the_job_uses_the_gpu_models_peak_and_the_layers_that_fit():
    assert [gpu_job.peak_flops_of(name) for name in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3",
                                                     "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla V100")] == \
        [756e12, 835e12, 989e12, 989e12, 312e12, None]
    spec = gpu_job.job_spec("llama3_8b", None, 1, 21, 2048, 2, "cuda", Path("/tmp/unused"), None)
    assert gpu_job.layers_that_fit(spec, 141e9 * gpu_job.USABLE) == (32, 32)  # the 8B unsharded on one H200
    fewer, whole = gpu_job.layers_that_fit(spec, 80e9 * gpu_job.USABLE)  # not on one 80 GB H100: said so
    assert whole == 32 and 0 < fewer < 32
    assert gpu_job.layers_that_fit(spec, None) == (32, 32)


def test_an_unknown_job_model_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--device", "cpu", "--model", "llama9"])
    assert exit.value.code == 2 and "--model llama9: " in capsys.readouterr().err


def test_an_unknown_strategy_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--device", "cpu", "--strategies", "fsdp,fl_avg"])
    assert exit.value.code == 2
    assert "--strategies: unknown fl_avg; expected some of fsdp, hsdp, fl_fsdp, fl_hsdp" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_check_on_cpu_ranks_runs_every_check(monkeypatch, capsys):
    """Two strategies (the loop is the same for all four, whose layouts test_layouts checks), to keep the suite
    short: every check still runs. Its six torchruns of `-m train` go to ranks forked from a preloaded interpreter
    (tests/forked.py); `python -m bench.gpu_check` is `sys.exit(main())`."""
    def forked_torchrun(spec_path, ranks, env):
        ranks = forked.torchrun("train", str(spec_path), nproc=ranks, env={**clean_env(), **env})
        return ranks.wait(timeout=600), ranks.stderr

    monkeypatch.setattr(gpu_check, "torchrun", forked_torchrun)
    status = main(["--device", "cpu", "--ranks", "4", "--check-model", "tiny", "--steps", "2", "--seq-len", "16",
                   "--strategies", "fsdp,fl_hsdp", "--model", "tiny", "--job-steps", "2", "--job-seq-len", "32"])
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
    job = [line for line in lines if line.startswith("job: ")]
    assert job[0].startswith("job: tiny, all layers, FSDP over 4 cpu rank(s), precision paper, 2 x 32 tokens per GPU, "
                             "2 timed steps"), job
    assert " tokens/s per GPU, MFU - " in job[1] and "first step " in job[1]
    assert "memory model 0." in job[2] and "dry-run 0." in job[2]  # predicted for the same spec, in GB
    assert job[3].startswith("job: energy ")
    assert lines[-1] == "gpu_check: all checks passed"


def test_torchtitans_figure_is_beside_only_the_same_gpus_and_setting():
    h100 = "NVIDIA H100 80GB HBM3"
    assert gpu_job.torchtitan_figures(h100, 8, 2, 8192, 32, 32)["compiled + selective AC"] == 6_667
    assert gpu_job.torchtitan_figures(h100, 128, 2, 8192, 32, 32)["compiled + selective AC + float8"] == 8_380
    assert gpu_job.torchtitan_figures("NVIDIA H200", 8, 2, 8192, 32, 32) == {}  # another GPU model
    assert gpu_job.torchtitan_figures(h100, 4, 2, 8192, 32, 32) == {}           # another count
    assert gpu_job.torchtitan_figures(h100, 8, 2, 2048, 32, 32) == {}           # another setting
    assert gpu_job.torchtitan_figures(h100, 8, 2, 8192, 20, 32) == {}           # fewer layers than the model's


def test_compare_needs_the_job(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--compare"])
    assert "--compare measures the job: give --model" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_accept_rehearsed_on_cpu_ranks(monkeypatch, capsys, tmp_path):
    """`python -m bench.gpu_accept` on 2 CPU ranks with the tiny model, the code path a lent GPU runs: the
    prediction registered first, the job eager, compiled (inductor's C++ backend) and compiled with selective
    checkpointing side by side (float8 refused in one line: no fp8 on a CPU), the parity rows in torchtitan's
    setting, each naming what keeps it from torchtitan's figures, and accept.json and README.md written."""
    def forked_torchrun(spec_path, ranks, env):
        ranks = forked.torchrun("train", str(spec_path), nproc=ranks, env={**clean_env(), **env})
        return ranks.wait(timeout=600), ranks.stderr

    monkeypatch.setattr(gpu_check, "torchrun", forked_torchrun)
    status = gpu_accept.main(["--device", "cpu", "--ranks", "2", "--model", "tiny", "--steps", "2", "--seq-len", "32",
                              "--parity-seq-len", "32", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    report = json.loads((tmp_path / "accept.json").read_text())
    rows = {row["variant"]: row for row in report["rows"]}
    assert report["prediction"]["dryrun_bytes"] > 0 and report["prediction"]["layers"] == 2
    for variant in ("eager", "compiled", "compiled + selective AC", "parity: compiled + selective AC"):
        row = rows[variant]
        assert row["tokens_per_s_per_device"] > 0 and row["peak_allocated_bytes"] > 0, row
        assert (row["compile_s"] > 0) == (variant != "eager")  # compilation timed apart, only where compiled
        # while training (no evaluation within the steps): one graph every layer runs, nothing recompiled
        assert (row["compile_graphs"], row["compile_recompiles"]) == ((0, 0) if variant == "eager" else (1, 0))
    assert rows["parity: compiled + selective AC"]["train"]["max_norm"] == 1.0
    assert "2 x 32 tokens (theirs: 2 x 8192)" in rows["parity: compiled + selective AC"]["differs"]
    assert "needs a GPU with fp8 tensor cores" in rows["compiled + selective AC + float8"]["not_run"]
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# GPU acceptance run") and "| compiled | " in readme and report["command"] in readme
