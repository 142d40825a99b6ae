"""The command that made a sweep, kept in <sweep dir>/command.txt, so that `action=report results_dir=DIR` in a
copied or committed sweep directory rebuilds its tables from that record alone, with no one having to remember
which sweep, cluster and overrides name it. The first line is the command that made the sweep; a later, different
command that ran in it (a resume with other retries, say) is appended."""
from __future__ import annotations

import shlex
from pathlib import Path

from launcher.errors import ConfigError
from train.common import write_atomic

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


def recorded(argv: list[str]) -> list[str]:
    """`action=report results_dir=DIR` alone, where DIR is a sweep directory with a record: the recorded command's
    own words (less how it ran: NOT_NAMING) with action=report and DIR's results_dir; any other argv as it is."""
    words = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if "=" in a}
    if set(argv) != {f"action={words.get('action')}", f"results_dir={words.get('results_dir')}"} \
            or words["action"] != "report":
        return argv
    sweep_dir = Path(words["results_dir"]).expanduser().resolve()
    path = sweep_dir / FILE
    if not path.exists():
        return argv
    first = path.read_text().splitlines()[0]
    if not first.startswith(PREFIX):
        raise ConfigError(f"{path}: its first line is not a `{PREFIX.strip()}` command: {first[:80]!r}")
    own = [w for w in shlex.split(first[len(PREFIX):]) if not w.startswith(NOT_NAMING)]
    print(f"fedshard: the report of {sweep_dir.name}, named by {path}: {shlex.join(own)}", flush=True)
    return [*own, "action=report", f"results_dir={sweep_dir.parent.parent}"]
