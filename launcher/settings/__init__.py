"""Compose the Hydra config (conf/) and turn it into typed, validated settings (the sections: settings.sections).

We use Hydra's compose API rather than @hydra.main so every configuration
mistake becomes one line and exit code 2, and so one invocation is one sweep.
"""
from __future__ import annotations

import difflib
import functools
import os
import re
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from launcher.settings.secrets import redact
from launcher.settings.sections import (
    Cluster,
    Export,
    Init,
    Plan,
    Preflight,
    Prepare,
    Probe,
    Sweep,
    Wandb,
    export_section,
    init_section,
    plan_section,
    preflight_section,
    prepare_section,
    probe_section,
    typed,
    wandb_section,
)
from train.contract.common import ConfigError
from train.contract.config import TrainKeys
from train.contract.sections import (
    DATA_KINDS,
    DataSection,
    ModelSection,
    data_section,
    matches,
    registered,
    reject_unknown,
)

# the source tree's conf/, or the copy a built wheel carries inside the package (pyproject.toml: launcher.conf)
_LAUNCHER = Path(__file__).resolve().parent.parent
CONF_DIR = next((d for d in (_LAUNCHER / "conf", _LAUNCHER.parent / "conf") if (d / "config.yaml").exists()),
                _LAUNCHER.parent / "conf")
ACTIONS = ("run", "plan", "report", "probe", "validate", "prepare", "dryrun", "status", "cancel", "tail",
           "init_cluster", "export", "preflight")
# What a multirun (-m) may sweep: what is trained, on what data, with what model (launcher.multirun). A sweep's own
# axes (strategies, A, F, nodes, tp, pp) are lists in one value instead: sweep.A=[8,16].
MULTIRUN_SECTIONS = ("train", "model", "data")
SWEEP_LISTS = tuple(f.name for f in fields(Sweep) if str(f.type).startswith("list"))


@dataclass
class Settings:
    action: str
    results_dir: Path
    retries: int
    retry_shrink: bool  # an attempt that lost nodes resumes on the largest layout the nodes left hold
    poll_s: float
    progress_s: float
    cluster: Cluster
    sweep: Sweep
    model: ModelSection
    train: TrainKeys  # every run's train settings before its layout takes tp and pp (launcher.sweep)
    data: DataSection
    wandb: Wandb
    probe: Probe
    prepare: Prepare
    plan: Plan
    init: Init
    export: Export
    preflight: Preflight
    run: str | None = None  # action=tail: the run id whose log to follow; action=export: the run to export

    @property
    def sweep_dir(self) -> Path:
        """Keyed by cluster too: planning or running one sweep on two clusters never mixes their files."""
        return self.results_dir / self.cluster.name / self.sweep.name


def check_writable(results_dir: Path) -> None:
    """results_dir, or the deepest part of it that exists, is a directory this process can create entries in:
    tried by making and removing an empty directory there, so nothing is left behind and nothing fails later."""
    existing = results_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"results_dir={results_dir} cannot be created: {existing} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fedshard-write-check-", dir=existing))
    except OSError as exc:
        raise ConfigError(f"results_dir={results_dir} is not writable here: {existing}: "
                          f"{exc.strerror or exc}") from None


def check_name(name, parent: Path, key: str = "sweep.name") -> Path:
    """parent/name, where name (cluster.name or sweep.name) is a single ordinary path component that stays
    inside parent: the sweep directory is <results_dir>/<cluster.name>/<sweep.name>."""
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ConfigError(f"{key} {name!r} must be a plain directory name (no '/', '\\', NUL; "
                          f"not empty, '.' or '..'): it names <results_dir>/<cluster.name>/<sweep.name>")
    path = parent / name
    if path.resolve().parent != parent.resolve():  # e.g. a symlink planted in a shared results_dir
        raise ConfigError(f"{key} directory {path} resolves to {path.resolve()}, outside {parent}")
    return path


def search_dirs(overrides: list[str]) -> list[Path]:
    """Where config groups are looked up: conf/, then every file:// directory of a `hydra.searchpath=[...]`
    override (what --config-dir DIR becomes: launcher.__main__)."""
    dirs = [CONF_DIR]
    for override in overrides:
        match = re.match(r"^\+{0,2}hydra\.searchpath=\[?(.*?)\]?$", override)
        if match:
            dirs += [Path(entry.strip().strip("'\"").removeprefix("file://")) for entry in match.group(1).split(",")
                     if entry.strip().strip("'\"").startswith("file://")]
    return dirs


def group_options(group: str, overrides: list[str]) -> list[str]:
    """Every option of a config group (cluster, sweep, model, ...) on the search path, and those registered."""
    files = {p.stem for d in search_dirs(overrides) for p in (d / group).glob("*.yaml")}
    return sorted(files | set(REGISTERED.get(group, {})))


# Options that are a dataclass's defaults, registered with Hydra's ConfigStore rather than copied into YAML files
# (the dataclasses are the one schema): train=base, which every preset of conf/train/ starts from, and data=KIND.
REGISTERED = {"train": {"base": TrainKeys}, "data": {cls.kind: cls for cls in DATA_KINDS.values()}}


@functools.cache  # ConfigStore is the process's: once is enough, however often compose runs
def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    for group, options in REGISTERED.items():
        for name, cls in options.items():
            ConfigStore.instance().store(group=group, name=name, node=registered(cls))


def compose(overrides: list[str]) -> Settings:
    """Hydra overrides (`sweep=paper_table3 cluster=leonardo ...`) -> validated Settings."""
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    register_schema()

    def composed(overrides: list[str]):
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            return hydra_compose("config", overrides=overrides, return_hydra_config=True)

    try:
        cfg = composed(overrides)
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]  # Hydra's own section holds values only a running app fills (hydra.job.num)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except yaml.YAMLError as exc:  # a config file that is not YAML: a cluster file edited by hand
        raise ConfigError(yaml_error(exc)) from None
    except MissingMandatoryValue as exc:  # a `???` in conf/, e.g. data=text without data.paths
        raise ConfigError(f"{exc.full_key} must be set (it is ??? in conf/): add {exc.full_key}=... to the "
                          f"command line") from None
    except UnicodeDecodeError as exc:  # a config file in another encoding
        raise ConfigError(not_utf8(overrides) or f"a config file is not UTF-8 text: {exc}") from None
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        msg = _first_line(exc, overrides)
        unknown = re.match(r"Could not override '([^']+)'", msg)
        if unknown:
            groups = [o for o in overrides if any((d / o.split("=")[0]).is_dir() for d in search_dirs(overrides))
                      or o.startswith("hydra.searchpath=")]  # sweep=..., cluster=..., --config-dir
            msg += _closest(unknown.group(1), lambda: composed(groups))
        raise ConfigError(msg) from None
    reject_unknown("top-level", raw, (f.name for f in fields(Settings)), ConfigError)
    if raw["action"] not in ACTIONS:
        raise ConfigError(f"action must be one of {', '.join(ACTIONS)}, got {raw['action']!r}")
    if not matches(raw["retries"], int) or raw["retries"] < 0:
        raise ConfigError(f"retries must be an integer >= 0, got {raw['retries']!r}")
    if not isinstance(raw["retry_shrink"], bool):
        raise ConfigError(f"retry_shrink must be true or false, got {raw['retry_shrink']!r}")
    for key in ("poll_s", "progress_s"):
        if not matches(raw[key], float) or not raw[key] > 0:
            raise ConfigError(f"{key} must be a number > 0, got {raw[key]!r}")
    for key in ("model", "train", "data", "wandb", "probe", "prepare", "plan", "init", "export", "preflight"):
        if not isinstance(raw[key], dict):
            raise ConfigError(f"{key} must be a mapping, got {raw[key]!r}")
    if not isinstance(raw["results_dir"], str) or not raw["results_dir"] or "\0" in raw["results_dir"]:
        raise ConfigError(f"results_dir must be a directory path, got {raw['results_dir']!r}")
    results_dir = Path(raw["results_dir"]).expanduser().resolve()  # the default is ~/fedshard-results
    check_writable(results_dir)
    if isinstance(raw["cluster"], dict):
        raw["cluster"]["name"] = cluster_name(raw["cluster"].get("name"), choices.get("cluster"), overrides)
    cluster = typed(Cluster, raw["cluster"], "cluster").validate()
    sweep = typed(Sweep, raw["sweep"], "sweep")
    check_name(sweep.name, check_name(cluster.name, results_dir, "cluster.name"))
    if sweep.target not in (None, "reference"):
        raise ConfigError(f"sweep.target must be reference or null, got {redact(repr(sweep.target))}")
    if not isinstance(sweep.train, dict):
        raise ConfigError(f"sweep.train must be a mapping, got {sweep.train!r}")
    return Settings(
        action=raw["action"], results_dir=results_dir, retries=raw["retries"],
        retry_shrink=raw["retry_shrink"], poll_s=float(raw["poll_s"]),
        progress_s=float(raw["progress_s"]),
        cluster=cluster, sweep=sweep, model=ModelSection.from_dict(raw["model"]),
        train=train_settings(raw["train"], sweep, overrides), data=data_section(raw["data"]),
        wandb=wandb_section(raw["wandb"]), probe=probe_section(raw["probe"]),
        prepare=prepare_section(raw["prepare"]), plan=plan_section(raw["plan"]),
        init=init_section(raw["init"]), export=export_section(raw["export"]),
        preflight=preflight_section(raw["preflight"]), run=_run_id(raw["run"]))

def yaml_error(exc) -> str:
    """A YAML syntax error as one line, `FILE:LINE:COLUMN: what` (PyYAML's marks count from 0), with where the
    construct it was reading began."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"a config file is not valid YAML: {' '.join(str(exc).split())}"
    where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    began = f" ({context}, begun at line {start.line + 1}, column {start.column + 1})" if context and start else ""
    return f"{where}: {exc.problem}{began}: the file is not valid YAML"


def not_utf8(overrides: list[str]) -> str | None:
    """`FILE:LINE:COLUMN: ...` of the first config file on the user's part of the search path (--config-dir) that
    is not UTF-8 text, which Hydra reports without naming it; None when none is."""
    for folder in search_dirs(overrides)[1:]:
        for path in sorted(folder.rglob("*.yaml")):
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                line = data.count(b"\n", 0, e.start) + 1
                column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
                return f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}): save the file as UTF-8"
    return None


def _run_id(value) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or "/" in value or value in (".", "..")):
        raise ConfigError(f"run must be a run id of the sweep (a directory name), got {value!r}")
    return value


def cluster_name(name, choice: str | None, overrides: list[str]):
    """A cluster is named by its file (mycluster.yaml: mycluster), which names <results_dir>/<name>/. A file whose
    `name:` says otherwise was most likely copied from another cluster's and would write under that one's
    directory: refused unless typed (cluster.name=...)."""
    if any(re.match(r"^\+{0,2}cluster\.name=", o) for o in overrides) or choice is None:
        return name
    if name is not None and name != choice:
        raise ConfigError(f"cluster file {choice}.yaml says name: {name}, so its results would go under {name}/ "
                          f"(a copy of {name}.yaml?): delete that line (a cluster is named by its file), or type "
                          f"cluster.name={name} to mean it")
    return choice

_TRAIN_OVERRIDE = re.compile(r"^\+{0,2}(sweep\.)?train\.(\w+)=")


def train_settings(preset: dict, sweep: Sweep, overrides: list[str]) -> TrainKeys:
    """The train settings every run of the sweep gets. Precedence, lowest first: the train preset
    (conf/train/), the sweep's `train:` block, then the command line, where the last typed of `train.K=`
    and `sweep.train.K=` wins. A typed value that replaces the sweep's is said (stdout: a note, not an error)."""
    merged = {**preset, **sweep.train}
    typed: dict[str, str] = {}  # key -> "train" or "sweep.train", whichever was typed last
    for override in overrides:
        match = _TRAIN_OVERRIDE.match(override)
        if match:
            typed[match.group(2)] = "sweep.train" if match.group(1) else "train"
    for key, where in typed.items():
        if where == "train" and key in sweep.train and preset.get(key) != sweep.train[key]:
            print(f"fedshard: note: train.{key}={preset.get(key)!r} (typed) replaces sweep {sweep.name}'s "
                  f"train.{key}={sweep.train[key]!r}")
            merged[key] = preset.get(key)
    reject_unknown("train", merged, (f.name for f in fields(TrainKeys)), ConfigError)  # a sweep's train: block
    if isinstance(merged.get("betas"), list):
        merged["betas"] = tuple(merged["betas"])
    return TrainKeys(**merged)


def _closest(key: str, config) -> str:
    """'; did you mean K?' for the known key nearest to an unknown one (in the config its groups select)."""
    from omegaconf import OmegaConf

    try:
        keys = list(_dotted(OmegaConf.to_container(config(), resolve=False)))
    except Exception:  # the groups chosen do not compose either: the first error is the one to show
        return ""
    parent, _, leaf = key.lstrip("+").rpartition(".")
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    if siblings:  # a known section: compare the last name only, so "train." itself is no likeness
        match = [f"{parent}.{m}" if parent else m for m in difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)]
    else:
        match = difflib.get_close_matches(key.lstrip("+"), keys, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def _dotted(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if key == "hydra":
            continue
        yield prefix + str(key)
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")


def sweep_list(key: str, values: list[str]) -> str | None:
    """How to type several values of one of the sweep's own axes (`sweep.A=8,16`, with or without -m): as one list,
    `sweep.A=[8,16]`; None for any other key."""
    section, _, name = key.lstrip("+~").partition(".")
    return f"{section}.{name}=[{','.join(values)}]" if section == "sweep" and name in SWEEP_LISTS else None


def _first_line(exc: Exception, overrides: list[str]) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else type(exc).__name__
    missing = re.search(r"Could not (?:find|load) '([^'/]+)/([^']*)'", msg)
    if missing:  # name the option typed and what exists: "sweep=paper_tabel3: no such sweep; did you mean ...?"
        group, value = missing.groups()
        options = group_options(group, overrides)
        close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
        msg = (f"{group}={value}: no such {group} (no {group}/{value}.yaml on the config path)"
               + (f"; did you mean {group}={close[0]}?" if close else "") + f" (available {group}: "
               f"{', '.join(options)}; your own: --config-dir DIR with DIR/{group}/NAME.yaml)")
    elif msg.startswith("Ambiguous value for argument"):
        typed = re.search(r"argument '([^'=]+)=([^']*)'", msg)
        key, value = typed.groups() if typed else ("KEY", "A,B")
        listed = sweep_list(key, value.split(","))
        if listed:
            msg = (f"{key}={value}: {key} is one of the sweep's own axes and takes its values as one list: "
                   f"{listed} (no -m)")
        elif key.lstrip("+~").split(".")[0] in MULTIRUN_SECTIONS:
            msg += f": several values sweep that key only in a multirun: python -m launcher -m ... {key}={value}"
        else:
            msg += (f": {key} takes one value; a multirun (-m) sweeps only {', '.join(MULTIRUN_SECTIONS)} keys, "
                    f"and a sweep's strategies, A, F and nodes take lists (sweep.A=[8,16])")
    elif msg.startswith("Could not override"):
        msg = msg.rstrip(".") + ": no such key (the keys are in conf/)"
    return msg
