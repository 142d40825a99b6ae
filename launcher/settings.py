"""Compose the Hydra config (conf/) and turn it into plain, validated settings.

We use Hydra's compose API rather than @hydra.main so every configuration
mistake becomes one line and exit code 2, and so one invocation is one sweep.
"""
from __future__ import annotations

import difflib
import functools
import os
import re
import shlex
import sys
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from launcher.errors import ConfigError
from launcher.report.wandb_log import MODES as WANDB_MODES
from launcher.secrets import redact
from train.config import TrainConfig
from train.sections import DATA_KINDS, check_types, matches, registered, reject_unknown

# the source tree's conf/, or the copy a built wheel carries inside the package (pyproject.toml: launcher.conf)
CONF_DIR = next((d for d in (Path(__file__).resolve().parent / "conf", Path(__file__).resolve().parent.parent / "conf")
                 if (d / "config.yaml").exists()), Path(__file__).resolve().parent.parent / "conf")
ACTIONS = ("run", "plan", "report", "probe", "validate", "prepare", "dryrun", "status", "cancel", "tail",
           "init_cluster")
# in_job: ranks ordered by topology at job start; pinned: nodes and rank order chosen at submission;
# slurm: SLURM's own node and rank order kept (the paper's runs; the placement ablation's baseline)
PLACEMENTS = ("in_job", "pinned", "slurm")


@dataclass
class Cluster:
    name: str
    executor: str
    nodes: int
    gpus_per_node: int
    device: str
    backend: str
    time_min: int
    max_ranks: int | None = None
    peak_flops: float | None = None
    gpu_memory_GB: float | None = None  # each device's memory: a layout that cannot fit is refused (null: no check)
    memory_reserve_GB: float | None = None  # kept free on each device (CUDA context, NCCL buffers, fragmentation):
                                            # the dry-run's peak must fit gpu_memory_GB less this (null: 0)
    fp8: bool | None = None       # the GPUs compute in fp8 (H100, H200, B200: true; A100: false): train.float8 is
                                  # refused before submitting where false (null: checked when the job starts)
    probe: str | None = None      # a probe.json for the step-time model (launcher.prediction)
    partition: str | int | None = None
    account: str | int | None = None
    qos: str | int | None = None
    setup: list[str] = field(default_factory=list)  # one command each, its words passed literally (see validate)
    sbatch_extra: dict = field(default_factory=dict)
    snapshot: str | None = None
    topology: str = "auto"        # auto: live scontrol only when its ClusterName is slurm_name | live | ideal
    topology_name: str | None = None  # SLURM >= 25.05: a named topology (default: the partition's Topology=)
    slurm_name: str | None = None  # SLURM's ClusterName of this cluster (default: name)
    bandwidth_GBps: list[float] = field(default_factory=list)
    nodes_per_level: list[int] = field(default_factory=list)
    placement: str = "in_job"
    switches_wait_min: int = 5
    sequential: bool = False      # submit one run at a time (always so for the local executor)
    python: str | None = None     # the interpreter the job's tasks run (null: this one, sys.executable); it must
                                  # exist at that path on the nodes (a venv on a shared filesystem)
    cpus_per_task: int | None = None  # sbatch --cpus-per-task (null: the site's default, often 1)
    mem: str | int | None = None  # sbatch --mem per node, e.g. 480G; 0: all of it (null: the site's default)
    netns: str | None = None      # clients must run inside this network namespace (the testbed)
    network: dict | None = None   # the testbed's network description (slurm/testbed/testbed.py)

    @property
    def rank_order(self) -> str:
        """Who orders the ranks: fedshard's placement (in_job, pinned) or SLURM (slurm); part of a run's identity."""
        return "slurm" if self.placement == "slurm" else "topology"

    @property
    def bandwidth(self) -> list[float]:
        """Per-level bandwidth in bytes/s."""
        return [b * 1e9 for b in self.bandwidth_GBps]

    def validate(self) -> "Cluster":
        if self.network is not None:
            _typed(TestbedNetwork, self.network, "cluster.network")
        if self.executor not in ("local", "slurm"):
            raise ConfigError(f"cluster.executor must be local or slurm, got {self.executor!r}")
        for key in ("nodes", "gpus_per_node", "time_min"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ConfigError(f"cluster.{key} must be a positive integer, got {getattr(self, key)!r}")
        if self.cpus_per_task is not None and (isinstance(self.cpus_per_task, bool) or self.cpus_per_task < 1):
            raise ConfigError(f"cluster.cpus_per_task must be a positive integer or null, got {self.cpus_per_task!r}")
        if {"cpus_per_task", "cpus-per-task", "mem"} & set(self.sbatch_extra):
            raise ConfigError("cluster.sbatch_extra sets cpus_per_task or mem: set cluster.cpus_per_task and "
                              "cluster.mem instead (the plan checks them against the nodes)")
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?", str(self.mem)):
            raise ConfigError(f"cluster.mem must be sbatch's --mem: a number with an optional K, M, G or T "
                              f"(0: all of a node's memory), or null, got {redact(repr(self.mem))}")
        if self.python is not None and not (isinstance(self.python, str) and os.path.isabs(self.python)):
            raise ConfigError(f"cluster.python must be an absolute path to the interpreter on the nodes, or null "
                              f"(this one: {sys.executable}), got {redact(repr(self.python))}")
        # Values land on #SBATCH lines of a script: a line break would start a shell command there.
        values = {"partition": self.partition, "account": self.account, "qos": self.qos,
                  **{f"setup[{i}]": v for i, v in enumerate(self.setup)},
                  **{f"sbatch_extra.{k}": v for k, v in self.sbatch_extra.items()}}
        for key, value in values.items():
            if isinstance(value, str) and any(c in value for c in "\n\r\0"):
                raise ConfigError(f"cluster.{key} contains a line break or NUL, which would end up as shell "
                                  f"text in the sbatch script: {redact(repr(value))}")
        for key, value in self.sbatch_extra.items():
            if not _OPTION.fullmatch(str(key)):
                raise ConfigError(f"cluster.sbatch_extra key {key!r} is not an sbatch option name "
                                  f"(letters, digits, '-' and '_')")
            if not isinstance(value, (str, int, float, bool)):
                raise ConfigError(f"cluster.sbatch_extra.{key} must be a single value, got {redact(repr(value))}")
        commands = [_one_command(line, f"cluster.setup[{i}]") for i, line in enumerate(self.setup)]
        self.setup = [command for command in commands if command]
        if self.gpu_memory_GB is not None and not (isinstance(self.gpu_memory_GB, (int, float))
                                                   and not isinstance(self.gpu_memory_GB, bool)
                                                   and self.gpu_memory_GB > 0):
            raise ConfigError(f"cluster.gpu_memory_GB must be a number > 0 or null, got {self.gpu_memory_GB!r}")
        reserve = self.memory_reserve_GB
        if reserve is not None and (isinstance(reserve, bool) or not isinstance(reserve, (int, float)) or reserve < 0
                                    or (self.gpu_memory_GB and reserve >= self.gpu_memory_GB)):
            raise ConfigError(f"cluster.memory_reserve_GB must be a number >= 0 below cluster.gpu_memory_GB, or null, "
                              f"got {reserve!r}")
        if self.topology not in ("auto", "live", "ideal"):
            raise ConfigError(f"cluster.topology must be auto, live or ideal, got {self.topology!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"cluster.placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        return self


@dataclass
class TestbedNetwork:
    """What slurm/testbed/testbed.py builds from cluster.network (conf/cluster/testbed.yaml)."""

    subnet: str          # the first three octets, e.g. 10.210.0
    leaves: dict[str, list[str]]  # leaf switch -> its nodes
    spine: str
    node_link: str       # tc rates, e.g. 1gbit
    trunk: str


@dataclass
class Wandb:
    enabled: bool  # log runs to Weights & Biases (grouped by sweep)
    mode: str      # offline | online | disabled
    project: str


@dataclass
class Prepare:
    """action=prepare: the corpus train.data.prepare tokenizes into data.path, as one CPU job (launcher.prepare)."""

    sources: list[str]           # .txt / .jsonl / .parquet files or directories
    workers: int                 # tokenizer processes; on SLURM also the job's --cpus-per-task
    text_key: str                # the jsonl field or parquet column holding text
    eval_fraction: float         # the held-out tail of the tokens
    partition: str | None = None  # null: cluster.partition
    time_min: int | None = None   # null: cluster.time_min


@dataclass
class Sweep:
    name: str
    strategies: list[str]
    A: list
    F: list[int]
    nodes: list
    paper_nodes: int | None = None
    repeats: int = 1
    exclude: list[dict] = field(default_factory=list)
    train: dict = field(default_factory=dict)
    target: str | None = None  # reference: the target perplexity comes from the reference (fsdp) runs, run first
    tp: list[int] = field(default_factory=list)  # tensor-parallel degrees to sweep ([]: train.tp)
    pp: list[int] = field(default_factory=list)  # pipeline stage counts to sweep ([]: train.pp)
    scaling: str = "none"  # weak: the batch per GPU stays across sweep.nodes; strong: the global batch does


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
    model: dict
    train: dict
    data: dict
    wandb: dict
    probe: dict
    prepare: Prepare
    plan: dict  # dryrun: action=plan plays every run on fake tensors too (launcher.dryrun)
    init: dict  # action=init_cluster: name, out (launcher.init_cluster)
    run: str | None = None  # action=tail: the run id whose log to follow

    @property
    def sweep_dir(self) -> Path:
        """Keyed by cluster too: planning or running one sweep on two clusters never mixes their files."""
        return self.results_dir / self.cluster.name / self.sweep.name


def _typed(cls, raw: dict, where: str):
    reject_unknown(where, raw, (f.name for f in fields(cls)), ConfigError)
    missing = [f.name for f in fields(cls) if f.name not in raw and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        template = " (conf/cluster/slurm.yaml has every key, commented)" if where == "cluster" else ""
        raise ConfigError(f"{where} is missing key(s): {', '.join(missing)}{template}")
    obj = cls(**raw)
    check_types(obj, where, ConfigError, show=lambda value: redact(repr(value)))
    return obj


def _one_command(line: str, key: str) -> str:
    """A setup entry as one command whose words reach the job literally: `;`, `$( )`, backticks, `&&`,
    quotes and globs become parts of arguments, never shell syntax (so `~` and `$VAR` are not expanded)."""
    try:
        return shlex.join(shlex.split(line))
    except ValueError as exc:  # an unbalanced quote or a trailing escape
        raise ConfigError(f"{key} cannot be split into words ({exc}): {redact(repr(line))}") from None


_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


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
REGISTERED = {"train": {"base": TrainConfig}, "data": {cls.kind: cls for cls in DATA_KINDS.values()}}


@functools.cache  # ConfigStore is the process's: once is enough, however often compose runs
def register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    for group, options in REGISTERED.items():
        for name, cls in options.items():
            ConfigStore.instance().store(group=group, name=name, node=registered(cls))


def compose(overrides: list[str]) -> Settings:
    """Hydra overrides (`sweep=paper_table3 cluster=leonardo ...`) -> validated Settings."""
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
    except MissingMandatoryValue as exc:  # a `???` in conf/, e.g. data=text without data.paths
        raise ConfigError(f"{exc.full_key} must be set (it is ??? in conf/): add {exc.full_key}=... to the "
                          f"command line") from None
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
    for key in ("model", "train", "data", "wandb", "probe", "prepare", "plan", "init"):
        if not isinstance(raw[key], dict):
            raise ConfigError(f"{key} must be a mapping, got {raw[key]!r}")
    if not isinstance(raw["results_dir"], str) or not raw["results_dir"] or "\0" in raw["results_dir"]:
        raise ConfigError(f"results_dir must be a directory path, got {raw['results_dir']!r}")
    results_dir = Path(raw["results_dir"]).resolve()
    check_writable(results_dir)
    if isinstance(raw["cluster"], dict):
        raw["cluster"]["name"] = cluster_name(raw["cluster"].get("name"), choices.get("cluster"), overrides)
    cluster = _typed(Cluster, raw["cluster"], "cluster").validate()
    sweep = _typed(Sweep, raw["sweep"], "sweep")
    check_name(sweep.name, check_name(cluster.name, results_dir, "cluster.name"))
    if sweep.target not in (None, "reference"):
        raise ConfigError(f"sweep.target must be reference or null, got {redact(repr(sweep.target))}")
    if not isinstance(sweep.train, dict):
        raise ConfigError(f"sweep.train must be a mapping, got {sweep.train!r}")
    return Settings(
        action=raw["action"], results_dir=results_dir, retries=raw["retries"],
        retry_shrink=raw["retry_shrink"], poll_s=float(raw["poll_s"]),
        progress_s=float(raw["progress_s"]),
        cluster=cluster, sweep=sweep, model=raw["model"], train=train_settings(raw["train"], sweep, overrides),
        data=raw["data"], wandb=_wandb_settings(raw["wandb"]), probe=_probe_settings(raw["probe"]),
        prepare=_prepare_settings(raw["prepare"]), plan=_plan_settings(raw["plan"]),
        init=_init_settings(raw["init"]), run=_run_id(raw["run"]))


def _init_settings(raw: dict) -> dict:
    reject_unknown("init", raw, ("name", "out"), ConfigError)
    for key in ("name", "out"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"init.{key} must be a string, got {raw[key]!r}")
    return raw


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


def _plan_settings(raw: dict) -> dict:
    reject_unknown("plan", raw, ("dryrun",), ConfigError)
    if not isinstance(raw.get("dryrun"), bool):
        raise ConfigError(f"plan.dryrun must be true or false, got {raw.get('dryrun')!r}")
    return raw


def _wandb_settings(raw: dict) -> dict:
    wandb = _typed(Wandb, raw, "wandb")
    if wandb.mode not in WANDB_MODES:
        raise ConfigError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {redact(repr(wandb.mode))}")
    return asdict(wandb)


def _probe_settings(probe: dict) -> dict:
    reject_unknown("probe", probe, ("max_bytes", "iters"), ConfigError)
    for key, low in (("max_bytes", 1024), ("iters", 1)):
        if not matches(probe.get(key), int) or probe[key] < low:
            raise ConfigError(f"probe.{key} must be an integer >= {low}, got {probe.get(key)!r}")
    return probe


def _prepare_settings(raw: dict) -> Prepare:
    prepare = _typed(Prepare, raw, "prepare")
    if prepare.workers < 1:
        raise ConfigError(f"prepare.workers must be at least 1, got {prepare.workers}")
    if not 0 < prepare.eval_fraction < 1:
        raise ConfigError(f"prepare.eval_fraction must be in (0, 1), got {prepare.eval_fraction}")
    if prepare.time_min is not None and prepare.time_min < 1:
        raise ConfigError(f"prepare.time_min must be a positive integer or null, got {prepare.time_min}")
    return prepare


_TRAIN_OVERRIDE = re.compile(r"^\+{0,2}(sweep\.)?train\.(\w+)=")


def train_settings(preset: dict, sweep: Sweep, overrides: list[str]) -> dict:
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
    return merged


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
        msg += ": several values sweep that key only in a multirun (python -m launcher -m ...)"
    elif msg.startswith("Could not override"):
        msg = msg.rstrip(".") + ": no such key (the keys are in conf/)"
    return msg
