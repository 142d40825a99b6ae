"""The settings' sections as typed dataclasses (cluster, sweep, wandb, probe, prepare, plan, init, export), each
checked whole when it is read: one clear line naming the key for every mistake."""
from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import MISSING, dataclass, field, fields

from launcher.settings.secrets import redact
from train.contract.common import ConfigError
from train.contract.sections import check_types, matches, reject_unknown

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
    peak_flops_fp8: float | None = None  # per device, dense fp8: float8 runs' MFU (null: not computed for them)
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
    preflight: bool = False       # every run's job checks its nodes before training (action=preflight's check)
    python: str | None = None     # the interpreter the job's tasks run (null: this one, sys.executable); it must
                                  # exist at that path on the nodes (a venv on a shared filesystem)
    cpus_per_task: int | None = None  # sbatch --cpus-per-task (null: the site's default, often 1)
    mem: str | int | None = None  # sbatch --mem per node, e.g. 480G; 0: all of it (null: the site's default)
    netns: str | None = None      # clients must run inside this network namespace (the testbed)
    network: dict | None = None   # the testbed's network description (slurm/testbed/testbed.py)
    node_mtbf_h: float | None = None  # a node's mean time between failures, hours: the plan prices each run's
                                      # expected goodput under faults (launcher.fault_tolerance; null: not priced)
    restart_s: float = 300.0      # from a lost node to the job training again: requeue (SLURM waits cred_expire,
                                  # 120 s by default), start, load; a restart's cost beyond the steps it trains again
    lighthouse_host: str | None = None  # train.fault_tolerance=groups on SLURM: the submitting host's name as the
                                        # nodes reach it, where the launcher's Lighthouse listens (null: its fqdn)

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
            typed(TestbedNetwork, self.network, "cluster.network")
        if self.executor not in ("local", "slurm"):
            raise ConfigError(f"cluster.executor must be local or slurm, got {self.executor!r}")
        if self.node_mtbf_h is not None and not (isinstance(self.node_mtbf_h, (int, float)) and self.node_mtbf_h > 0):
            raise ConfigError(f"cluster.node_mtbf_h must be a number of hours > 0, or null, got {self.node_mtbf_h!r}")
        if not (isinstance(self.restart_s, (int, float)) and self.restart_s >= 0):
            raise ConfigError(f"cluster.restart_s must be a number of seconds >= 0, got {self.restart_s!r}")
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
        if self.mem is not None and str(self.mem).isdigit() and 0 < int(self.mem) < 1024 * self.gpus_per_node:
            raise ConfigError(f"cluster.mem={self.mem} has no unit, so sbatch reads {self.mem} MB per node: under "
                              f"1 GB for each of its {self.gpus_per_node} tasks: write the unit, "
                              f"cluster.mem={self.mem}G for gigabytes ({self.mem}M if you mean megabytes; 0: all of a "
                              f"node's memory)")
        if self.snapshot is not None:
            self.snapshot = os.path.expanduser(str(self.snapshot))  # a cluster file's `snapshot: ~/snap`
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


WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class Wandb:
    enabled: bool  # log runs to Weights & Biases (grouped by sweep)
    mode: str      # WANDB_MODES
    project: str


@dataclass
class Probe:
    """action=probe: collectives up to max_bytes, each point the median of at least `iters` calls; each compute
    calibration measures for up to budget_s seconds (launcher.actions.probe)."""

    max_bytes: int
    iters: int
    budget_s: float = 10.0  # per calibration (a workload, a layout, a 0-layer step): rounds until a layer is known
                            # within ±5 % or this has passed (train.measure.calibrate)


@dataclass
class Plan:
    dryrun: bool  # action=plan plays every run on fake tensors too (launcher.actions.dryrun)


@dataclass
class Init:
    """action=init_cluster: the cluster file's name and the directory it is written to
    (launcher.actions.init_cluster)."""

    name: str | None = None
    out: str | None = None


@dataclass
class Preflight:
    """action=preflight and cluster.preflight (launcher.actions.preflight): how hard to look and what counts as
    slow."""

    bytes: int | None = None  # ping-pong message size per link (null: 64 MiB on GPUs, 1 MiB on CPU ranks)
    iters: int = 5
    fraction: float = 0.5  # of the peers' median (or of cluster.bandwidth_GBps) below which a rank or link is named


@dataclass
class Export:
    """action=export: where run=RUN_ID's trained model goes as a Hugging Face directory (launcher.actions.export);
    null: <run dir>/hf."""

    out: str | None = None


@dataclass
class Prepare:
    """action=prepare: the corpus train.data.prepare tokenizes into data.path, as one CPU job
    (launcher.actions.prepare)."""

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


def typed(cls, raw: dict, where: str):
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


def init_section(raw: dict) -> Init:
    init = typed(Init, raw, "init")
    for key in ("name", "out"):
        if getattr(init, key) is not None and not isinstance(getattr(init, key), str):
            raise ConfigError(f"init.{key} must be a string, got {getattr(init, key)!r}")
    return init


def preflight_section(raw: dict) -> Preflight:
    preflight = typed(Preflight, raw, "preflight")
    if preflight.bytes is not None and (not matches(preflight.bytes, int) or preflight.bytes < 1024):
        raise ConfigError(f"preflight.bytes must be an integer >= 1024 or null, got {preflight.bytes!r}")
    if not matches(preflight.iters, int) or preflight.iters < 1:
        raise ConfigError(f"preflight.iters must be an integer >= 1, got {preflight.iters!r}")
    if not matches(preflight.fraction, float) or not 0 < preflight.fraction < 1:
        raise ConfigError(f"preflight.fraction must be a number in (0, 1), got {preflight.fraction!r}")
    return preflight


def export_section(raw: dict) -> Export:
    export = typed(Export, raw, "export")
    if export.out is not None and (not export.out or "\0" in export.out):
        raise ConfigError(f"export.out must be a directory path or null, got {export.out!r}")
    return export


def plan_section(raw: dict) -> Plan:
    plan = typed(Plan, raw, "plan")
    if not isinstance(plan.dryrun, bool):
        raise ConfigError(f"plan.dryrun must be true or false, got {plan.dryrun!r}")
    return plan


def wandb_section(raw: dict) -> Wandb:
    wandb = typed(Wandb, raw, "wandb")
    if wandb.mode not in WANDB_MODES:
        raise ConfigError(f"wandb.mode must be one of {', '.join(WANDB_MODES)}, got {redact(repr(wandb.mode))}")
    return wandb


def probe_section(raw: dict) -> Probe:
    probe = typed(Probe, raw, "probe")
    for key, low in (("max_bytes", 1024), ("iters", 1)):
        if not matches(getattr(probe, key), int) or getattr(probe, key) < low:
            raise ConfigError(f"probe.{key} must be an integer >= {low}, got {getattr(probe, key)!r}")
    if not matches(probe.budget_s, float) or probe.budget_s < 0:
        raise ConfigError(f"probe.budget_s must be a number of seconds >= 0, got {probe.budget_s!r}")
    return probe


def prepare_section(raw: dict) -> Prepare:
    prepare = typed(Prepare, raw, "prepare")
    if prepare.workers < 1:
        raise ConfigError(f"prepare.workers must be at least 1, got {prepare.workers}")
    if not 0 < prepare.eval_fraction < 1:
        raise ConfigError(f"prepare.eval_fraction must be in (0, 1), got {prepare.eval_fraction}")
    if prepare.time_min is not None and prepare.time_min < 1:
        raise ConfigError(f"prepare.time_min must be a positive integer or null, got {prepare.time_min}")
    return prepare
