"""Local or SLURM is decided once (launcher.scheduler.of) from the cluster: the rest of the launcher asks its
Scheduler, never which executor it has."""
import re

from launcher import scheduler as schedulers
from launcher.settings import compose
from tests.support import ROOT


def test_the_cluster_chooses_its_scheduler_once(tmp_path):
    local = schedulers.of(compose([f"results_dir={tmp_path}"]).cluster)
    slurm = schedulers.of(compose(["cluster=leonardo", f"results_dir={tmp_path}"]).cluster)
    assert isinstance(local, schedulers.Local) and local.runs_here and local.sequential
    assert local.topology()[1:] == ("virtual nodes", False) and local.job_environment(tmp_path) == []
    assert isinstance(slurm, schedulers.Slurm) and slurm.reads_topology and not slurm.runs_here
    assert any(line.startswith("job python: ") for line in slurm.job_environment(tmp_path))


def test_no_module_but_the_scheduler_and_the_config_asks_for_the_executor():
    pattern = re.compile(r"\.executor\s*[!=]=|executor in")
    asked = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "launcher").rglob("*.py"))
             if path.name not in ("scheduler.py", "settings.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert asked == []


def test_every_action_is_a_function_of_the_experiment_and_expands_the_sweep_once(tmp_path, monkeypatch):
    from launcher import actions, experiment, sweep
    from launcher.actions import plan
    from launcher.settings import ACTIONS

    assert set(actions.TABLE) == set(ACTIONS)
    calls = []
    for module in (experiment, plan):  # plan expands the sweep itself only when it is not given the runs
        monkeypatch.setattr(module, "expand", lambda settings: calls.append(1) or sweep.expand(settings))
    e = experiment.Experiment(compose(["action=plan", f"results_dir={tmp_path}"]))
    assert actions.act(e) == 0 and e.runs is e.runs and calls == [1]
