"""The command that made a sweep, kept in <sweep dir>/command.txt, so that `action=report results_dir=DIR` in a
copied or committed sweep directory rebuilds its tables from that record alone, with no one having to remember
which sweep, cluster and overrides name it. The first line is the command that made the sweep; a later, different
command that ran in it (a resume with other retries, say) is appended."""
from __future__ import annotations

import shlex
from pathlib import Path

from train.contract.common import ConfigError, write_atomic

FILE = "command.txt"
PREFIX = "python -m launcher "
NOT_NAMING = ("action=", "results_dir=", "poll_s=", "progress_s=", "retries=")  # how, not what, it ran


def record(sweep_dir: Path, argv: list[str]) -> None:
    """Add the command to the sweep's record unless it is there already."""
    path = sweep_dir / FILE
    lines = path.read_text().splitlines() if path.exists() else []
    line = PREFIX + shlex.join(argv)
    if line not in lines:
        write_atomic(path, "\n".join([*lines, line]) + "\n")


def recorded(argv: list[str]) -> tuple[list[str], Path | None]:
    """`action=report results_dir=DIR` alone, where DIR is a sweep directory with a record: the recorded command's
    own words (less how it ran: NOT_NAMING) with action=report and DIR's results_dir, and DIR, which the composed
    settings must name again (check); any other argv as it is, and None."""
    given = dict(a.split("=", 1) for a in argv if "=" in a)
    if len(argv) != 2 or given.get("action") != "report" or "results_dir" not in given:
        return argv, None
    sweep_dir = Path(given["results_dir"]).expanduser().resolve()
    path = sweep_dir / FILE
    if not path.exists():
        return argv, None
    first = path.read_text().splitlines()[0]
    if not first.startswith(PREFIX):
        raise ConfigError(f"{path}: its first line is not a `{PREFIX.strip()}` command: {first[:80]!r}")
    own = [w for w in shlex.split(first[len(PREFIX):]) if not w.startswith(NOT_NAMING)]
    print(f"fedshard: the report of {sweep_dir.name}, named by {path}: {shlex.join(own)}", flush=True)
    return [*own, "action=report", f"results_dir={sweep_dir.parent.parent}"], sweep_dir


def check(sweep_dir: Path, replayed: Path | None) -> None:
    """A replayed record must name the directory it was read from (a renamed copy names another)."""
    if replayed is not None and sweep_dir.resolve() != replayed:
        raise ConfigError(f"{replayed / FILE} names the sweep directory {sweep_dir}, not {replayed}: run the "
                          f"report with the recorded words and a results_dir whose <cluster>/<sweep> is this one")
