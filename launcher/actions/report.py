"""action=report: every table and plot of a sweep rebuilt from its runs' result.json files (launcher.report)."""
from __future__ import annotations

from launcher.report.results import load_results
from launcher.report.write import outputs, write_report
from launcher.settings import Settings


def report(settings: Settings) -> int:
    markdown, written = write_report(settings.sweep_dir, load_results(settings.sweep_dir), settings.cluster,
                                     settings.sweep.scaling)
    print(markdown)
    print(outputs(settings.sweep_dir, written))
    return 0
