"""The command lines themselves: Hydra's flags on the launcher, override precedence, `python -m train --help`."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support import ROOT, clean_env


def _run(*argv, cwd, **env):
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=clean_env(slurm_client=False, **env))


def test_help_lists_config_groups_and_their_choices(tmp_path):
    proc = _run("-m", "launcher", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    groups = {line.split(":")[0]: line.split(": ")[1].split(", ") for line in proc.stdout.splitlines()
              if line.split(":")[0] in ("cluster", "data", "model", "sweep", "train") and ": " in line}
    from launcher.settings import REGISTERED  # train=base and data=KIND: dataclasses, no files

    for group, choices in groups.items():
        files = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
        assert choices == sorted(files | set(REGISTERED.get(group, {}))), group
    assert set(groups) == {"cluster", "data", "model", "sweep", "train"}
    assert "Precedence, lowest first" in proc.stdout and "action=plan" in proc.stdout


def test_help_into_a_closed_pipe_is_quiet(tmp_path):
    """`fedshard --help | head -3`: the reader closes the pipe early (`true` reads nothing, so the write certainly
    meets a closed pipe); no BrokenPipeError traceback, and head still gets the first lines."""
    def piped(reader):
        return subprocess.run(f"{sys.executable} -m launcher --help | {reader}", shell=True, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env=clean_env(slurm_client=False))
    head = piped(f"{shutil.which('head')} -3")
    assert head.stdout.splitlines()[0].startswith("fedshard: ") and len(head.stdout.splitlines()) == 3
    closed = piped(shutil.which("true"))
    assert closed.stderr == "", closed.stderr


def test_version_and_config_dir_flags(tmp_path):
    version = _run("-m", "launcher", "--version", cwd=tmp_path)
    assert version.returncode == 0 and re.match(r"fedshard \S+ \(Hydra ", version.stdout), version.stdout
    sweep = tmp_path / "mine" / "sweep"
    sweep.mkdir(parents=True)
    shutil.copy(ROOT / "conf" / "sweep" / "smoke.yaml", sweep / "my_smoke.yaml")
    for flag in (["--config-dir", str(tmp_path / "mine")], ["-cd", str(tmp_path / "mine")],
                 [f"--config-dir={tmp_path / 'mine'}"]):
        proc = _run("-m", "launcher", *flag, "sweep=my_smoke", "action=plan", f"results_dir={tmp_path / 'r'}",
                    cwd=tmp_path)
        assert proc.returncode == 0, (flag, proc.stderr[-2000:])
    assert (tmp_path / "r" / "local").is_dir()


def test_cfg_prints_the_composed_config_and_submits_nothing(tmp_path):
    job = _run("-m", "launcher", "--cfg", "job", "sweep=testbed_table3", "model=tiny", "train.lr=0.5",
               f"results_dir={tmp_path / 'r'}", cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    cfg = yaml.safe_load(job.stdout)
    assert cfg["sweep"]["name"] == "testbed_table3" and cfg["model"] == {"preset": "tiny"}
    assert cfg["train"]["lr"] == 0.5 and "hydra" not in cfg
    full = _run("-m", "launcher", "--cfg", "all", cwd=tmp_path)
    assert full.returncode == 0 and "hydra" in yaml.safe_load(full.stdout)
    package = _run("-m", "launcher", "--cfg", "job", "--package", "cluster", cwd=tmp_path)
    assert package.returncode == 0 and yaml.safe_load(package.stdout)["name"] == "local"
    assert not (tmp_path / "r").exists() and sorted(os.listdir(tmp_path)) == []


def test_info_and_hydra_help(tmp_path):
    info = _run("-m", "launcher", "--info", "defaults", cwd=tmp_path)
    assert info.returncode == 0 and "sweep/smoke" in info.stdout and "cluster/local" in info.stdout
    hydra_help = _run("-m", "launcher", "--hydra-help", cwd=tmp_path)
    assert hydra_help.returncode == 0 and "Hydra" in hydra_help.stdout and "--cfg" in hydra_help.stdout


def test_tab_completion_through_the_console_script(tmp_path):
    fedshard = shutil.which("fedshard")
    assert fedshard, "pip install -e . installs the fedshard console script"
    def complete(line):
        return subprocess.run([fedshard, "-sc", "query=bash"], capture_output=True, text=True, timeout=120,
                              env=clean_env(COMP_LINE=line), cwd=tmp_path).stdout.split()
    assert complete("fedshard sweep=sm") == ["sweep=smoke"]
    assert "train.steps=" in complete("fedshard train.st")


def test_typed_train_keys_win_over_the_sweeps_train_block(tmp_path):
    """smoke's `train: {steps: 6}` used to win over `train.steps=10` on the command line."""
    def steps(*overrides):
        proc = _run("-m", "launcher", "sweep=smoke", "action=plan", *overrides, f"results_dir={tmp_path}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        plan = json.loads((tmp_path / "local" / "smoke" / "plan.json").read_text())
        return {e["train"]["steps"] for e in plan["runs"]}, proc.stdout

    assert steps()[0] == {6}
    got, out = steps("train.steps=10")
    assert got == {10} and "train.steps=10 (typed) replaces sweep smoke's train.steps=6" in out
    assert steps("train.steps=10", "sweep.train.steps=7")[0] == {7}  # the last typed wins
    assert steps("sweep.train.steps=7", "train.steps=10")[0] == {10}
    assert steps("train.lr=0.5")[1].count("note") == 0  # nothing shadowed, nothing said


def test_train_help_exits_zero_and_bad_usage_exits_two(tmp_path):
    proc = _run("-m", "train", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m train SPEC.json")
    assert "result.json" in proc.stdout and not proc.stderr
    bad = _run("-m", "train", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == "usage: python -m train SPEC.json"


def test_plans_for_two_clusters_do_not_overwrite_each_other(tmp_path):
    """Planning paper_table3 on leonardo used to overwrite the local run's plan.json and topology.json."""
    for cluster in ("local", "leonardo"):
        proc = _run("-m", "launcher", "sweep=paper_table3", f"cluster={cluster}", "action=plan",
                    f"results_dir={tmp_path}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert f"plan written to {tmp_path / cluster / 'paper_table3' / 'plan.json'}" in proc.stdout
        # one direction for every ratio: "less comm than FSDP", never a "vs FSDP" below 1
        assert "less comm than FSDP" in proc.stdout and " x FSDP" not in proc.stdout
        assert not re.search(r"\b0\.\d+×", proc.stdout), proc.stdout
    plans = {c: json.loads((tmp_path / c / "paper_table3" / "plan.json").read_text()) for c in ("local", "leonardo")}
    assert {c: p["cluster"] for c, p in plans.items()} == {"local": "local", "leonardo": "leonardo"}
    assert plans["local"]["runs"][0]["world_size"] == 8 and plans["leonardo"]["runs"][0]["world_size"] == 512
    assert (tmp_path / "local" / "paper_table3" / "topology.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["leonardo", "local"]


def test_every_train_key_has_its_default_from_the_schema_and_presets_hold_overrides_only():
    """train=base is TrainConfig's defaults, registered with Hydra's ConfigStore (no YAML copy); every preset starts
    from it, so no key needs a `+`, and sets only keys it changes (or, citing the authors, pins their value)."""
    import dataclasses

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from launcher.settings import CONF_DIR, compose, register_schema
    from train.contract.config import TrainKeys

    defaults = {f.name: f.default for f in dataclasses.fields(TrainKeys)}
    assert not (ROOT / "conf" / "train" / "base.yaml").exists()
    register_schema()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        base = OmegaConf.to_container(hydra_compose("config", overrides=["train=base"]).train)
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in base.items()} == defaults
    for preset in sorted(p.stem for p in (ROOT / "conf" / "train").glob("*.yaml")):
        assert set(dataclasses.asdict(compose(["sweep=smoke", f"train={preset}"]).train)) >= set(defaults), preset
        own = yaml.safe_load((ROOT / "conf" / "train" / f"{preset}.yaml").read_text())
        own.pop("defaults")
        cited = {line.split(":")[0] for line in (ROOT / "conf" / "train" / f"{preset}.yaml").read_text().splitlines()
                 if "# [xffl]" in line or "# [paper]" in line}  # a default pinned to the authors' value, cited
        repeated = {k for k, v in own.items() if (tuple(v) if isinstance(v, list) else v) == defaults[k]} - cited
        assert not repeated, f"conf/train/{preset}.yaml repeats defaults: {sorted(repeated)}"
    typed = compose(["sweep=smoke", "train.eps=1e-6", "train.watchdog_s=30", "train.init=meta"]).train
    assert (typed.eps, typed.watchdog_s, typed.init) == (1e-6, 30, "meta")


def test_a_built_wheel_plans_from_another_directory_without_torch(tmp_path):
    """A non-editable install carries conf/ (as launcher/conf), and planning on a login node imports neither torch
    nor transformers."""
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    def pip(*args):
        proc = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]

    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), str(ROOT))
    pip("install", "--no-deps", "--target", str(site), *map(str, wheel_dir.glob("*.whl")))
    plan = ("import runpy, sys; sys.argv = ['launcher', 'sweep=smoke', 'action=plan', 'results_dir=out']\n"
            "try:\n    runpy.run_module('launcher', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
            "import launcher\nprint(launcher.__file__, code, sorted({'torch', 'transformers'} & set(sys.modules)))")
    env = {**clean_env(), "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", plan], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == f"{site / 'launcher' / '__init__.py'} 0 []"
    assert (tmp_path / "out" / "local" / "smoke" / "plan.json").exists()


@pytest.mark.parametrize("where, why", [("afile", "afile is a file, not a directory"),
                                        ("afile/deeper", "afile is a file, not a directory"),
                                        ("/proc/fedshard-results", "is not writable here: /proc")])
def test_a_results_dir_that_cannot_be_written_is_one_line(where, why, tmp_path, capsys):
    from launcher.__main__ import main

    (tmp_path / "afile").write_text("")
    assert main(["sweep=smoke", "action=plan", f"results_dir={tmp_path / where}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshard: error: results_dir=") and why in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing left behind


def test_plan_console_sizes_split_and_no_clear_winner(tmp_path):
    from launcher.actions.plan import close_to_best
    from launcher.placement.memory import human_bytes

    assert [human_bytes(n) for n in (4.13e12, 48.2e9, 28.9e6, 1500, 12)] == ["4.13 TB", "48.2 GB", "28.9 MB",
                                                                          "1.5 kB", "12 B"]
    ranked = [{"predicted_step_s": s} for s in (1.0, 1.1, 1.19, 1.5)]
    assert close_to_best(ranked) == 3 and close_to_best(ranked[3:]) == 1 and close_to_best([]) == 0
    proc = _run("-m", "launcher", "sweep=paper_table3", "cluster=leonardo", "action=plan", f"results_dir={tmp_path}",
                cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()[0]) < 200  # scontrol's last words at most, not its whole error
    assert "compute     comm  step (s)" in proc.stdout and "4.13 TB" in proc.stdout and "e+03 GB" not in proc.stdout
    assert re.search(r"no clear winner: the \d+ fastest layouts are within ±20% of the fastest", proc.stdout)
