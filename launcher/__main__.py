"""`python -m launcher sweep=NAME [cluster=NAME] [action=run|plan|dryrun|report|probe|validate|prepare]
[results_dir=DIR] [overrides]` (also installed as `fedshard`).

Overrides are composed by Hydra here, so that every error is one line; Hydra's own flags (--help,
--hydra-help, --cfg job|hydra|all, --package, --resolve, --info, --shell-completion) are handed to a
real Hydra app on the same conf/, so they behave exactly as Hydra documents them.
"""
from __future__ import annotations

import sys

from train.errors import FedshardError

HYDRA_FLAGS = frozenset({"-h", "--help", "--hydra-help", "-c", "--cfg", "-p", "--package", "--resolve",
                         "-i", "--info", "-sc", "--shell-completion"})


def hydra_cli(argv: list[str]) -> int:
    """Hydra's flags on conf/: they print and exit; with only --resolve left, the sweep runs as usual."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from launcher.settings import CONF_DIR

    outcome = {"rc": 0}

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
    def app(_cfg) -> None:
        outcome["rc"] = main(list(HydraConfig.get().overrides.task))

    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        app()
    finally:
        sys.argv = saved
    return outcome["rc"]


def main(argv: list[str]) -> int:
    if any(a.split("=", 1)[0] in HYDRA_FLAGS for a in argv):
        return hydra_cli(argv)
    from launcher import multirun
    from launcher.settings import compose

    try:
        runs = None  # expand(settings) unless a multirun (-m) gives every point's runs
        if any(a in multirun.FLAGS for a in argv):
            fixed, axes = multirun.split([a for a in argv if a not in multirun.FLAGS])
            settings, runs = multirun.expand_points(fixed, axes) if axes else (compose(fixed), None)
        else:
            settings = compose(argv)
        if settings.action in ("plan", "dryrun"):
            from launcher.plan import plan

            plan(settings, runs)
            return 0
        if settings.action == "probe":
            from launcher.probe import probe

            probe(settings, runs)
            return 0
        if settings.action == "prepare":
            from launcher.prepare import prepare

            return prepare(settings)
        if settings.action == "report":
            from launcher.report.results import load_results
            from launcher.report.write import outputs, write_report

            markdown, written = write_report(settings.sweep_dir, load_results(settings.sweep_dir), settings.cluster,
                                             settings.sweep.scaling)
            print(markdown)
            print(outputs(settings.sweep_dir, written))
            return 0
        from launcher.run import run_sweep

        if settings.action == "validate":
            from launcher.validate import validate

            return validate(settings, runs)
        return run_sweep(settings, runs)
    except FedshardError as exc:  # anything else is a bug: its traceback is kept
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedshard: interrupted; running jobs cancelled, manifest.jsonl is consistent: "
              "run the same command again to resume", file=sys.stderr)
        return 130


def cli() -> None:
    """The `fedshard` console script (Hydra's tab completion needs a command name: `fedshard -sc install=bash`)."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
