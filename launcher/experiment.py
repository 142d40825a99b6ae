"""What one command acts on, built once: the composed settings and the sweep's runs (expanded on first use; a
multirun gives them over all its points), and the table of actions, each a function of it."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from launcher.settings import Settings
from launcher.sweep import Run, expand


@dataclass
class Experiment:
    settings: Settings
    given: list[Run] | None = None  # a multirun's runs, every point's
    command: list[str] | None = None  # the words typed, kept in the sweep directory by the actions that run

    @functools.cached_property
    def runs(self) -> list[Run]:
        return expand(self.settings) if self.given is None else self.given


# Each action's module is imported when it runs: a plan needs neither torch nor submitit's job machinery.
def _run(e: Experiment) -> int:
    from launcher.run import run_sweep

    return run_sweep(e.settings, e.runs, e.command)


def _plan(e: Experiment) -> int:
    from launcher.plan import plan

    plan(e.settings, e.runs)
    return 0


def _report(e: Experiment) -> int:
    from launcher.report.results import load_results
    from launcher.report.write import outputs, write_report

    s = e.settings
    markdown, written = write_report(s.sweep_dir, load_results(s.sweep_dir), s.cluster, s.sweep.scaling)
    print(markdown)
    print(outputs(s.sweep_dir, written))
    return 0


def _probe(e: Experiment) -> int:
    from launcher.probe import probe

    probe(e.settings, e.runs)
    return 0


def _validate(e: Experiment) -> int:
    from launcher.validate import validate

    return validate(e.settings, e.runs, e.command)


def _prepare(e: Experiment) -> int:
    from launcher.prepare import prepare

    return prepare(e.settings)


def _control(name: str) -> Callable[[Experiment], int]:
    def act(e: Experiment) -> int:
        from launcher import control

        return getattr(control, name)(e.settings, e.runs)
    return act


def _init_cluster(e: Experiment) -> int:
    from launcher.init_cluster import init_cluster

    return init_cluster(e.settings)


TABLE: dict[str, Callable[[Experiment], int]] = {
    "run": _run, "plan": _plan, "dryrun": _plan, "report": _report, "probe": _probe, "validate": _validate,
    "prepare": _prepare, "status": _control("status"), "cancel": _control("cancel"), "tail": _control("tail"),
    "init_cluster": _init_cluster,
}


def act(experiment: Experiment) -> int:
    """The experiment's action (launcher.settings checked it is one of ACTIONS, each of which is in TABLE)."""
    return TABLE[experiment.settings.action](experiment)
