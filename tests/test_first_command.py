"""The README's first command, as a newcomer types it: its four strategies learn, and it shows nothing untrue
(no step-time prediction without a compute calibration, no placement table where every rank ran on one machine)."""
import subprocess
import sys

import pytest

from launcher.report.results import load_results
from tests.support import ROOT, clean_env


@pytest.mark.slow
def test_paper_table3_on_this_machine_learns(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=paper_table3", f"results_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=ROOT, env=clean_env(slurm_client=False), timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep_dir = tmp_path / "local" / "paper_table3"
    results = load_results(sweep_dir)
    assert sorted(r.strategy for r in results) == ["fl_fsdp", "fl_hsdp", "fsdp", "hsdp"]
    for r in results:  # well below what a unigram count of the eval data achieves
        assert r.eval_ppl <= 0.5 * r.baseline_ppl, (r.run_id, r.eval_ppl, r.baseline_ppl)
    table = (sweep_dir / "table3.md").read_text()
    assert table.count("| yes |") == 4 and "| not learned |" not in table
    assert not (sweep_dir / "prediction.md").exists() and not (sweep_dir / "placement.md").exists()
