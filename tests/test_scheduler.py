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
