"""Config values reach sbatch only as arguments, results stay under results_dir, and no secret is printed."""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.settings import check_name
from launcher.settings.secrets import redact
from tests.support import clean_env
from train.contract.common import ConfigError

HOSTILE = "x; touch INJECTED $(touch INJECTED) `touch INJECTED` 'q' && touch INJECTED | tee INJECTED"


def _env(**extra):
    return clean_env(slurm_client=False, **extra)


def _plan(workdir: Path, *overrides, env=None):
    workdir.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "action=plan", *overrides,
                           f"results_dir={workdir / 'results'}"], capture_output=True, text=True, cwd=workdir,
                          env=env or _env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    cluster = next((o.split("=", 1)[1] for o in overrides if o.startswith("cluster=")), "local")
    return proc, json.loads((workdir / "results" / cluster / "smoke" / "plan.json").read_text())


def _run_in_sandbox(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    proc = subprocess.run(["bash", "-c", script], cwd=sandbox, capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "HOME": str(sandbox)})
    assert not list(sandbox.iterdir()), f"the shell ran injected commands: {sorted(os.listdir(sandbox))}"
    return proc


SETUP = ["echo x; touch INJECTED", "echo $(touch INJECTED) `touch INJECTED` && touch INJECTED || touch INJECTED",
         "echo \"a'b\" 'c d' > INJECTED"]


def test_setup_entries_are_single_commands_with_literal_words(tmp_path):
    setup = "[" + ", ".join(json.dumps(entry) for entry in SETUP) + ", \"module load cuda/12.1\", " \
            "\"source /opt/venv/bin/activate\", \"export NCCL_IB_DISABLE=0\"]"
    _, plan = _plan(tmp_path, "cluster=leonardo", f"cluster.setup={setup}")
    script = plan["runs"][0]["sbatch"]
    lines = script.split("\n# setup\n", 1)[1].split("\n\n# command", 1)[0].splitlines()
    # Harmless entries read as written; hostile ones are one quoted command each.
    assert lines[3:] == ["module load cuda/12.1", "source /opt/venv/bin/activate", "export NCCL_IB_DISABLE=0"]
    for entry, line in zip(SETUP, lines):
        assert shlex.split(line) == shlex.split(entry)
        # Run it: `echo` prints its arguments literally, and nothing else happens.
        proc = _run_in_sandbox(line, tmp_path)
        assert proc.returncode == 0 and proc.stdout == " ".join(shlex.split(entry)[1:]) + "\n"
    # The whole script up to srun (shebang, #SBATCH lines, setup) runs without executing any injected text.
    head = script.split("\n# command", 1)[0].replace("module load cuda/12.1", "true").replace(
        "source /opt/venv/bin/activate", "true")
    assert _run_in_sandbox(head, tmp_path).returncode == 0


@pytest.mark.parametrize("override", ["cluster.partition", "cluster.account", "cluster.qos",
                                      "+cluster.sbatch_extra.comment", "+cluster.sbatch_extra.job_name"])
@pytest.mark.slow
def test_cluster_values_and_job_names_stay_one_quoted_sbatch_argument(tmp_path, override):
    _, plan = _plan(tmp_path, "cluster=leonardo", f"{override}=\"{HOSTILE}\"")
    option = override.rsplit(".", 1)[1].replace("_", "-")
    for run in plan["runs"]:
        script = run["sbatch"]
        lines = [line for line in script.splitlines() if "INJECTED" in line]
        assert lines == [f"#SBATCH --{option}={shlex.quote(HOSTILE)}"]  # a comment to the shell
        assert shlex.split(lines[0]) == ["#SBATCH", f"--{option}={HOSTILE}"]  # one argument to sbatch
        assert _run_in_sandbox(script.split("\n# command", 1)[0], tmp_path).returncode == 0
    if override.endswith("job_name"):
        return
    # Without the override, job names are run ids: strategy and numbers only.
    _, plain = _plan(tmp_path, "cluster=leonardo")
    assert [r["resources"]["job_name"] for r in plain["runs"]] == ["fsdp-F1-R1-S8", "fl_fsdp-F2-R1-S4-A2"]


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/abs", "a\\b", "a\0b", 7])
def test_sweep_names_that_would_leave_results_dir_are_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="must be"):
        check_name(name, tmp_path)
    assert check_name("paper_table3", tmp_path) == tmp_path / "paper_table3"


def test_redact_hides_secret_looking_assignments_only():
    assert redact("export HF_TOKEN=hf_abc") == "export HF_TOKEN=***"
    assert redact("export 'WANDB_API_KEY=a b' X=1") == "export 'WANDB_API_KEY=***' X=1"
    assert redact("--db-password=\"p w\" --wckey=submitit") == "--db-password=*** --wckey=submitit"
    assert redact("export NCCL_IB_DISABLE=0") == "export NCCL_IB_DISABLE=0"


SENTINELS = {"WANDB_API_KEY": "sentinel-wandb-7f3a", "HF_TOKEN": "sentinel-hf-91c2",
             "DB_PASSWORD": "sentinel-password-55e1"}


def _leaks(texts: dict) -> list:
    return [(where, name) for where, text in texts.items() for name, secret in SENTINELS.items() if secret in text]


def _written(root: Path) -> dict:  # every file, binary ones (W&B's .wandb log, pickles) read as text too
    return {str(p): p.read_bytes().decode(errors="replace") for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_no_secret_reaches_outputs_logs_or_plans(tmp_path):
    env = _env(**SENTINELS)
    # The launcher: a local plan, and a SLURM plan whose setup exports a token (shown as ***, kept for the job).
    local, _ = _plan(tmp_path / "local", "model=tiny", env=env)
    setup = f"cluster.setup=[\"export HF_TOKEN={SENTINELS['HF_TOKEN']}\"]"
    slurm, plan = _plan(tmp_path / "slurm", "model=tiny", "cluster=leonardo", setup, env=env)
    assert "export HF_TOKEN=***" in plan["runs"][0]["sbatch"]
    assert plan["runs"][0]["resources"]["setup"][-1] == "export HF_TOKEN=***"
    # A real local sweep: launcher, submitit logs, four ranks training, the manifest, and W&B (offline) files.
    ran = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "sweep.strategies=[fsdp]",
                          "sweep.train.steps=2", "wandb.enabled=true", f"results_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    sweep_dir = tmp_path / "run" / "local" / "smoke"
    assert list(sweep_dir.glob("*/submitit/attempt1/*_log.err"))  # the jobs' logs are read too
    assert list((sweep_dir / "wandb").glob("offline-run-*"))
    texts = {**_written(tmp_path), "launcher stdout (local)": local.stdout + local.stderr,
             "launcher stdout (slurm)": slurm.stdout + slurm.stderr, "sweep output": ran.stdout + ran.stderr}
    assert _leaks(texts) == []
