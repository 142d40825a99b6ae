"""`python -m launcher [--config-dir DIR] sweep=NAME [cluster=NAME] [action=...] [results_dir=DIR] [overrides]`
(also installed as `fedshard`).

Overrides are composed by Hydra here, so that every error is one line; Hydra's own flags (--help,
--hydra-help, --cfg job|hydra|all, --package, --resolve, --info, --shell-completion) are handed to a
real Hydra app on the same conf/, so they behave exactly as Hydra documents them. --config-dir/-cd DIR adds DIR
to the config search path (DIR/cluster/NAME.yaml: your cluster, outside the checkout), as Hydra's does.
"""
from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

from launcher.records import record
from train.contract.common import FedshardError

HYDRA_FLAGS = frozenset({"-h", "--help", "--hydra-help", "-c", "--cfg", "-p", "--package", "--resolve",
                         "-i", "--info", "-sc", "--shell-completion"})
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
OTHER_FLAGS = ("-m", "--multirun", "--version")


def config_dirs(argv: list[str]) -> list[str]:
    """argv with every `--config-dir DIR` / `-cd DIR` (or `--config-dir=DIR`) made the override Hydra's flag
    stands for, `hydra.searchpath=[file://DIR]` (the directory absolute, checked to exist)."""
    out, dirs, args = [], [], iter(argv)
    for arg in args:
        flag, eq, value = arg.partition("=")
        if flag not in CONFIG_DIR_FLAGS:
            out.append(arg)
            continue
        value = value if eq else next(args, None)
        if not value:
            raise FedshardError(f"{flag} needs a directory: {flag} DIR (holding DIR/cluster/NAME.yaml, ...)")
        path = Path(value).expanduser().resolve()
        if not path.is_dir():
            raise FedshardError(f"{flag} {value}: no such directory")
        dirs.append(f"file://{path}")
    return out + ([f"hydra.searchpath=[{','.join(dirs)}]"] if dirs else [])


def home_paths(argv: list[str]) -> list[str]:
    """Overrides whose value starts with `~` (`init.out=~/fedshard-conf`) with it expanded, as a shell expands
    `VAR=~/x` but not `init.out=~/x`: Hydra's override grammar has no unquoted `~` in a value (it would answer
    LexerNoViableAltException). A `~` that starts a key (`~key`, Hydra's delete) is left alone."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and not arg.startswith("-") and re.fullmatch(r"~[\w.-]*(/.*)?", value):
            arg = f"{key}={os.path.expanduser(value)}"
        out.append(arg)
    return out


def check_words(argv: list[str]) -> None:
    """One line for what is neither an override nor a known flag: `--dry-run`, `sweep paper_table3`."""
    from launcher.settings import ACTIONS, CONF_DIR

    for i, arg in enumerate(argv):
        if arg.startswith("-") and arg.split("=", 1)[0] not in (*HYDRA_FLAGS, *OTHER_FLAGS):
            word = arg.lstrip("-").replace("-", "").replace("_", "")
            action = next((a for a in ACTIONS if a == word), None)
            hint = f"did you mean action={action}? " if action else ""
            raise FedshardError(f"unknown option {arg}: {hint}fedshard takes key=value overrides (action=plan, "
                                f"sweep=NAME, ...) and Hydra's flags (--config-dir DIR, --cfg job, --help, -m)")
        takes_value = ("-c", "--cfg", "-p", "--package", "-sc", "-i", "--info")  # --info's word is optional
        if "=" not in arg and not arg.startswith("-") and (i == 0 or argv[i - 1] not in takes_value):
            after = argv[i + 1] if i + 1 < len(argv) and "=" not in argv[i + 1] else "VALUE"
            close = difflib.get_close_matches(arg, sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
                                              + ["action", "results_dir"], n=1)
            fix = f"{close[0] if close else arg}={after}"
            raise FedshardError(f"{arg!r} is not an override: overrides are key=value, e.g. {fix}")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import hydra

    try:
        ours = installed("fedshard")
    except PackageNotFoundError:  # a source checkout that was never installed
        ours = "(not installed)"
    return f"fedshard {ours} (Hydra {hydra.__version__}, Python {sys.version.split()[0]})"


def hydra_cli(argv: list[str]) -> int:
    """Hydra's flags on conf/: they print and exit; with only --resolve left, the sweep runs as usual."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from launcher.settings import CONF_DIR, register_schema

    register_schema()
    outcome = {"rc": 0}

    searchpath = [a for a in argv if a.startswith("hydra.searchpath=")]  # --config-dir, kept for the sweep

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
    def app(_cfg) -> None:
        outcome["rc"] = main([*HydraConfig.get().overrides.task, *searchpath])

    # Hydra's argparse takes overrides as one run of words: the search path goes beside the others
    argv = [a for a in argv if a not in searchpath]
    at = next((i for i, a in enumerate(argv) if "=" in a and not a.startswith("-")
               and (i == 0 or argv[i - 1] not in ("-sc", "--shell-completion"))), 0)
    argv[at:at] = searchpath
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        app()
    finally:
        sys.argv = saved
    return outcome["rc"]


def main(argv: list[str]) -> int:
    try:
        if "--version" in argv:
            print(version())
            return 0
        argv, replayed = record.recorded(home_paths(config_dirs(argv)))
        check_words(argv)
    except FedshardError as exc:
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    if any(a.split("=", 1)[0] in HYDRA_FLAGS for a in argv):
        return hydra_cli(argv)
    from launcher import multirun
    from launcher.actions import act
    from launcher.experiment import Experiment
    from launcher.settings import compose

    try:
        runs = None  # expand(settings) unless a multirun (-m) gives every point's runs
        if any(a in multirun.FLAGS for a in argv):
            fixed, axes = multirun.split([a for a in argv if a not in multirun.FLAGS])
            settings, runs = multirun.expand_points(fixed, axes) if axes else (compose(fixed), None)
        else:
            settings = compose(argv)
        record.check(settings.sweep_dir, replayed)
        return act(Experiment(settings, runs, argv))
    except FedshardError as exc:  # anything else is a bug: its traceback is kept
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedshard: interrupted; running jobs cancelled, manifest.jsonl is consistent: "
              "run the same command again to resume", file=sys.stderr)
        return 130


def cli() -> None:
    """The `fedshard` console script (Hydra's tab completion needs a command name: `fedshard -sc install=bash`).
    A reader that stops early (`fedshard --help | head -3`) ends the output quietly, as other commands do."""
    try:
        rc = main(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush must not fail
        rc = 141  # 128 + SIGPIPE, as a shell reports it
    sys.exit(rc)


if __name__ == "__main__":
    cli()
