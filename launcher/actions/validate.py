"""action=validate: probe -> plan -> runs -> report in one command, so the step-time model is checked against a
calibration made before the runs, with predictions registered before each run started; nothing can be refitted
afterwards. It refuses a sweep directory that already holds results, and a probe chosen by hand."""
from __future__ import annotations

from launcher.actions.probe import probe
from launcher.actions.run import run_sweep
from launcher.settings import Settings
from launcher.sweep import expand
from train.contract.common import ConfigError


def validate(settings: Settings, runs: list | None = None, command: list[str] | None = None) -> int:
    if settings.cluster.probe is not None:
        raise ConfigError("action=validate probes this cluster itself, before the runs; unset cluster.probe (a probe "
                          "picked among several is a calibration chosen afterwards)")
    runs = expand(settings) if runs is None else runs
    done = [r.run_id for r in runs if (settings.sweep_dir / r.run_id / "result.json").exists()]
    if done:
        raise ConfigError(f"action=validate needs runs that have not run yet, but {settings.sweep_dir} holds "
                          f"results of {len(done)} ({done[0]}{', ...' if len(done) > 1 else ''}): use a fresh "
                          f"results_dir")
    probe(settings, runs)
    return run_sweep(settings, runs, command)
