"""The launcher's actions, one module each (action=run, plan, dryrun, report, probe, validate, prepare, status,
cancel, tail, init_cluster, export), each a function of the Experiment; TABLE maps the word to it."""
from __future__ import annotations

from collections.abc import Callable

from launcher.experiment import Experiment


# Each action's module is imported when it runs: a plan needs neither torch nor submitit's job machinery.
def _run(e: Experiment) -> int:
    from launcher.actions.run import run_sweep

    return run_sweep(e.settings, e.runs, e.command)


def _plan(e: Experiment) -> int:
    from launcher.actions.plan import plan

    plan(e.settings, e.runs)
    return 0


def _report(e: Experiment) -> int:
    from launcher.actions.report import report

    return report(e.settings)


def _probe(e: Experiment) -> int:
    from launcher.actions.probe import probe

    probe(e.settings, e.runs)
    return 0


def _validate(e: Experiment) -> int:
    from launcher.actions.validate import validate

    return validate(e.settings, e.runs, e.command)


def _prepare(e: Experiment) -> int:
    from launcher.actions.prepare import prepare

    return prepare(e.settings)


def _control(name: str) -> Callable[[Experiment], int]:
    def act(e: Experiment) -> int:
        from launcher.actions import control

        return getattr(control, name)(e.settings, e.runs)
    return act


def _init_cluster(e: Experiment) -> int:
    from launcher.actions.init_cluster import init_cluster

    return init_cluster(e.settings)


def _export(e: Experiment) -> int:
    from launcher.actions.export import export

    return export(e.settings, e.runs)


def _preflight(e: Experiment) -> int:
    from launcher.actions.preflight import preflight

    return preflight(e.settings, e.runs)


TABLE: dict[str, Callable[[Experiment], int]] = {
    "run": _run, "plan": _plan, "dryrun": _plan, "report": _report, "probe": _probe, "validate": _validate,
    "prepare": _prepare, "status": _control("status"), "cancel": _control("cancel"), "tail": _control("tail"),
    "init_cluster": _init_cluster, "export": _export,
    "preflight": _preflight,
}


def act(experiment: Experiment) -> int:
    """The experiment's action (launcher.settings checked it is one of ACTIONS, each of which is in TABLE)."""
    return TABLE[experiment.settings.action](experiment)
