"""The bad-input table: every row runs the real CLI (forked from an interpreter that has imported it, tests/forked.py)
and must end with one line `fedshard: error: ...`, exit
status 2, and nothing submitted or written. docs/troubleshooting.md lists the same ids.

A case is (id, command, expected fragment, prepare):
- command: ("launcher", [overrides]) for `python -m launcher`, or ("train", {spec overrides}) for
  `python -m train SPEC.json` (a spec built here: fsdp on one rank, the tiny model);
- prepare(ctx) sets up files, fake SLURM tools and environment in a fresh directory.
Strings in commands may hold {tmp} (the case's directory) and {port} (a loopback port nothing listens on).
"""
import fcntl
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import forked
from tests.support import PYTHON_ONLY, ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "slurm-22.05.8"


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@dataclass
class Ctx:
    """What a case's prepare step may set up."""
    tmp: Path
    tokenizer: Path
    env: dict = field(default_factory=dict)
    tools: dict = field(default_factory=dict)   # fake SLURM commands on PATH: name -> shell body
    held: list = field(default_factory=list)    # objects to keep alive while the command runs (locks, sockets)
    port: int = 0                               # a loopback port nothing listens on
    spec_path: Path | None = None               # train: run this path instead of the spec built from the case

    @property
    def results(self) -> Path:
        return self.tmp / "results"

    @property
    def run(self) -> Path:
        return self.tmp / "run"


# ---------------------------------------------------------------- prepare steps

def prepared_tokens(truncate: bool = False):
    """{tmp}/tokens: 80 words of text prepared with the tiny tokenizer; its last shard cut short if asked."""
    def step(ctx: Ctx) -> None:
        from train.data.prepare import prepare

        (ctx.tmp / "corpus").mkdir()
        (ctx.tmp / "corpus" / "a.txt").write_text(" ".join(f"w{i % 100}" for i in range(80)))
        index, _ = prepare([str(ctx.tmp / "corpus")], str(ctx.tokenizer), ctx.tmp / "tokens", eval_fraction=0.3)
        if truncate:
            shard = ctx.tmp / "tokens" / index["files"][-1]["shard"]
            shard.write_bytes(shard.read_bytes()[:-4])
    return step


def edited_tokenizer(ctx: Ctx) -> None:
    """{tmp}/tok2: the tiny tokenizer with one file changed, so its hash differs."""
    shutil.copytree(ctx.tokenizer, ctx.tmp / "tok2")
    config = ctx.tmp / "tok2" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 17}))


def snapshot(topology: str | bytes | None = None, nodes: str | None = None, nodes_file: bool = True):
    """A `slurm/capture.sh` directory at {tmp}/snap: the captured 22.05 cluster unless told otherwise."""
    def prepare(ctx: Ctx):
        snap = ctx.tmp / "snap"
        snap.mkdir()
        topology_text = _fixture("show_topology.txt") if topology is None else topology
        (snap / "topology.txt").write_bytes(topology_text if isinstance(topology_text, bytes)
                                            else topology_text.encode())
        if nodes_file:
            (snap / "nodes.txt").write_text(_fixture("show_node_oneliner.txt") if nodes is None else nodes)
    return prepare


def node_lines(first: int, cut: str | None = None, rest: int | None = None, again: int | None = None) -> str:
    """The captured nodes.txt: its first `first` lines, then (`cut`) the next line up to that field and the 5
    characters after its '=', then the lines from `rest` on; `again`: that line once more at the end."""
    lines = _fixture("show_node_oneliner.txt").splitlines(keepends=True)
    text = "".join(lines[:first])
    if cut is not None:
        text += lines[first][:lines[first].index(f" {cut}=") + len(cut) + 7]
    if rest is not None:
        text += "\n" + "".join(lines[rest:])
    return text + (lines[again] if again is not None else "")


def topoconf(ctx: Ctx):
    """A SLURM >= 25.05 snapshot: the 25.11 capture's topology.yaml (topologies ib and nvl) beside the others."""
    (ctx.tmp / "snap" / "topoconf.yaml").write_text(
        (ROOT / "tests" / "fixtures" / "slurm-25.11.7" / "multi_topology_yaml" / "show_topoconf.txt").read_text())


def nvl72(ctx: Ctx):
    """The NVL72-like block snapshot (tests/fixtures/nvl72) at {tmp}/snap."""
    shutil.copytree(ROOT / "tests" / "fixtures" / "nvl72", ctx.tmp / "snap")


def states(replace: str):
    """The captured nodes with every State= replaced."""
    return re.sub(r"State=\S+", f"State={replace}", _fixture("show_node_oneliner.txt"))


def tools(**bodies):
    def prepare(ctx: Ctx):
        ctx.tools.update(bodies)
    return prepare


def results_file(name: str, text: str):
    def prepare(ctx: Ctx):
        path = ctx.results / "local" / "smoke" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return prepare


def locked_sweep(ctx: Ctx):
    """Another launcher holds the sweep directory's lock."""
    path = ctx.results / "local" / "smoke" / ".lock"
    path.parent.mkdir(parents=True)
    fh = open(path, "a+")
    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.write("pid 4242")
    fh.flush()
    ctx.held.append(fh)


def exported_before(ctx: Ctx):
    """results/smoke's fsdp run with a published checkpoint, and the hf/ directory an earlier export filled."""
    run = ctx.results / "local" / "smoke" / "fsdp-F1-R1-S4"
    (run / "checkpoints" / "step-000006").mkdir(parents=True)
    (run / "checkpoints" / "step-000006" / "meta.json").write_text('{"step": 6}')
    (run / "hf").mkdir()
    (run / "hf" / "config.json").write_text("{}")


def symlinked_sweep(ctx: Ctx):
    """results/smoke is a link to a directory outside results/."""
    (ctx.tmp / "elsewhere").mkdir()
    (ctx.results / "local").mkdir(parents=True)
    (ctx.results / "local" / "smoke").symlink_to(ctx.tmp / "elsewhere")


def env(**values):
    def prepare(ctx: Ctx):
        ctx.env.update(values)
    return prepare


def spec_file(text: str | None):
    """The spec path holds `text` (None: it does not exist)."""
    def prepare(ctx: Ctx):
        ctx.spec_path = ctx.tmp / "spec.json"
        if text is not None:
            ctx.spec_path.write_text(text)
    return prepare


def text_data(name: str, content: str | None = None):
    """{tmp}/data/NAME (a directory when content is None); the spec names the session's tiny tokenizer."""
    def prepare(ctx: Ctx):
        data = ctx.tmp / "data"
        data.mkdir()
        if content is None:
            (data / name).mkdir()
        else:
            (data / name).write_text(content)
    return prepare


def broken_tokenizer(ctx: Ctx):
    tok = ctx.tmp / "tok"
    tok.mkdir()
    (tok / "tokenizer_config.json").write_text("{not json")
    (tok / "tokenizer.json").write_text("garbage")


def rendezvous_file(ctx: Ctx):
    """A rendezvous file left by a rank 0 that is gone: it names a loopback port nothing listens on."""
    ctx.run.mkdir()
    (ctx.run / ".rendezvous-slurm-4242-0-0").write_text(f"127.0.0.1 {ctx.port}\n")


def earlier_run(*overrides):
    """results/smoke holds the run directories (spec.json) that `python -m launcher OVERRIDES` would create."""
    def prepare(ctx: Ctx):
        from launcher.settings import compose
        from launcher.sweep import expand

        for run in expand(compose([*overrides, f"results_dir={ctx.results}"])):
            run.spec.save(Path(run.spec.out_dir) / "spec.json")
    return prepare


def cluster_file(name: str, base: str = "local", drop: str | None = None, name_line: str | None = None):
    """{tmp}/site/cluster/NAME.yaml: conf/cluster/BASE.yaml with the line `DROP:` removed, or its name: line
    replaced, as a user's copy outside the checkout (--config-dir {tmp}/site)."""
    def prepare(ctx: Ctx):
        lines = (ROOT / "conf" / "cluster" / f"{base}.yaml").read_text().splitlines()
        lines = [line for line in lines if not (drop and line.startswith(f"{drop}:"))]
        if name_line is not None:
            lines = [name_line if line.startswith("name:") else line for line in lines]
        (ctx.tmp / "site" / "cluster").mkdir(parents=True)
        (ctx.tmp / "site" / "cluster" / f"{name}.yaml").write_text("\n".join(lines) + "\n")
    return prepare


def cluster_file_bytes(name: str, old: bytes, new: bytes):
    """{tmp}/site/cluster/NAME.yaml: conf/cluster/slurm.yaml with `old` replaced by `new` (a syntax error, another
    encoding), as a file init_cluster wrote and its user then edited (--config-dir {tmp}/site)."""
    def prepare(ctx: Ctx):
        (ctx.tmp / "site" / "cluster").mkdir(parents=True)
        text = (ROOT / "conf" / "cluster" / "slurm.yaml").read_bytes()
        (ctx.tmp / "site" / "cluster" / f"{name}.yaml").write_bytes(text.replace(old, new, 1))
    return prepare


def a_file(ctx: Ctx):
    """{tmp}/afile: a regular file where a directory is expected."""
    (ctx.tmp / "afile").write_text("")


def both(*steps):
    def prepare(ctx: Ctx):
        for step in steps:
            step(ctx)
    return prepare


# ---------------------------------------------------------------- the table

SNAP = ["cluster=leonardo", "cluster.snapshot={tmp}/snap", "cluster.bandwidth_GBps=[240,25,12.5,6]", "action=plan"]
TEXT = {"kind": "text", "paths": ["{tmp}/data"], "tokenizer": "{TOKENIZER}"}
RANK1_OF_2 = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}"}
SLURM_RANK1_OF_2 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242"}
FL2 = {"strategy": "fl_fsdp", "F": 2, "A": 2}
# scontrol --version answers without a controller; everything else needs one
FAIL_SCONTROL = ('[ "$1" = --version ] && { echo "slurm 22.05.8"; exit 0; }\n'
                 'echo "slurm_load_topo error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n')
TWO_LEAVES = ("SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0001-0004]\n"
              "SwitchName=leaf02 Level=0 LinkSpeed=1 Nodes=lrdn[0004-0008]\n"
              "SwitchName=spine Level=1 LinkSpeed=1 Nodes=lrdn[0001-0008] Switches=leaf[01-02]\n")
UNKNOWN_CHILD = ("SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0001-0004]\n"
                 "SwitchName=spine Level=1 LinkSpeed=1 Nodes=lrdn[0001-0004] Switches=leaf[01-02]\n")
CYCLE = ("SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0001-0004]\n"
         "SwitchName=cellA Level=1 LinkSpeed=1 Switches=leaf01,cellB\n"
         "SwitchName=cellB Level=1 LinkSpeed=1 Switches=cellA\n")
# conf/cluster/slurm.yaml's line of a key, 1-based: where a YAML error in an edited copy is reported
TEMPLATE = (ROOT / "conf" / "cluster" / "slurm.yaml").read_text().splitlines()
TEMPLATE_LINE = {key: next(n for n, line in enumerate(TEMPLATE, 1) if line.startswith(f"{key}:"))
                 for key in ("partition", "account")}


def launcher(*args):
    return ("launcher", list(args))


def train(**spec):
    return ("train", spec)


CASES = [
    # ---- configs: groups, keys, values
    ("unknown-sweep", launcher("sweep=nope"), "sweep=nope: no such sweep (no sweep/nope.yaml on the config path) "
                                              "(available sweep: agg_frequency, agg_tradeoff, batch_control_reference, "
                                              "batch_control_small, diloco, diloco_streaming, learn, paper_table3, "
                                              "paper_table4, precision_fp32, precision_paper, scaling_strong, "
                                              "scaling_weak, smoke", None),
    ("misspelt-sweep", launcher("sweep=paper_tabel3"), "did you mean sweep=paper_table3?", None),
    ("unknown-cluster", launcher("cluster=nope"), "available cluster: leonardo, local, nvl72, slurm", None),
    ("unknown-model", launcher("model=nope"), "available model: llama3_8b, mini, small, tiny", None),
    ("misspelt-model", launcher("model=llama3-8b"), "model=llama3-8b: no such model (no model/llama3-8b.yaml on the "
                                                    "config path); did you mean model=llama3_8b?", None),
    ("word-without-equals", launcher("sweep", "paper_table3"), "'sweep' is not an override: overrides are key=value, "
                                                               "e.g. sweep=paper_table3", None),
    ("unknown-flag", launcher("--dry-run"), "unknown option --dry-run: did you mean action=dryrun?", None),
    ("cluster-file-no-backend", launcher("--config-dir", "{tmp}/site", "cluster=mine"),
     "cluster is missing key(s): backend", cluster_file("mine", drop="backend", name_line="name: null")),
    ("cluster-file-copied-name", launcher("-cd", "{tmp}/site", "cluster=mine", "cluster.partition=gpu"),
     "cluster file mine.yaml says name: slurm, so its results would go under slurm/ (a copy of slurm.yaml?)",
     cluster_file("mine", base="slurm", name_line="name: slurm")),
    ("cluster-file-yaml-syntax", launcher("--config-dir", "{tmp}/site", "cluster=mine", "action=plan"),
     f"{{tmp}}/site/cluster/mine.yaml:{TEMPLATE_LINE['partition'] + 1}:1: expected ',' or ']', but got '<scalar>' "
     f"(while parsing a flow sequence, begun at line {TEMPLATE_LINE['partition']}, column 12)",
     cluster_file_bytes("mine", b"partition: ???", b"partition: [gpu")),
    ("cluster-file-not-utf8", launcher("--config-dir", "{tmp}/site", "cluster=mine", "action=plan"),
     f"{{tmp}}/site/cluster/mine.yaml:{TEMPLATE_LINE['account']}:13: not UTF-8 text (byte 0xe9)",
     cluster_file_bytes("mine", b"account: null", b"account: caf\xe9")),
    ("init-out-is-a-file", launcher("action=init_cluster", "init.name=lab", "init.out={tmp}/afile",
                                    "cluster.snapshot={tmp}/snap"),
     "init.out={tmp}/afile: {tmp}/afile is a file, not a directory", both(snapshot(), a_file)),
    ("host-memory-8b-local", launcher("sweep=paper_table3", "model=llama3_8b", "action=plan"),
     "available (MemAvailable)", None),
    ("unknown-override-key", launcher("train.bogus=1"), "Could not override 'train.bogus': no such key", None),
    ("misspelt-key", launcher("train.epz=1e-6"), "no such key (the keys are in conf/); did you mean train.eps?", None),
    ("misspelt-section", launcher("clustr.nodes=2"), "did you mean cluster.nodes?", None),
    ("unknown-train-key", launcher("+train.bogus=1"), "unknown train key(s): bogus", None),
    ("unknown-cluster-key", launcher("+cluster.bogus=1"), "unknown cluster key(s): bogus", None),
    ("unknown-top-level-key", launcher("+bogus=1"), "unknown top-level key(s): bogus", None),
    ("unknown-action", launcher("action=explode"), "action must be one of run, plan, report", None),
    ("unknown-strategy", launcher("sweep.strategies=[fsdp,diloco]"), "unknown strategy 'diloco'", None),
    ("unknown-model-preset", launcher("model.preset=huge"), "unknown model preset 'huge'; expected one of", None),
    ("unknown-data-kind", launcher("data.kind=csv"), "unknown data kind 'csv'", None),
    ("missing-mandatory", launcher("data=text"), "data.paths must be set (it is ??? in conf/): add data.paths=... "
     "to the command line", None),
    ("unknown-data-key", launcher("+data.shuffle=1"), "unknown data (kind 'synthetic') key(s): shuffle", None),
    ("wrong-type", launcher("cluster.max_ranks=many"), "cluster.max_ranks must be an integer or null, got 'many'",
     None),
    ("not-a-list", launcher("sweep.strategies=fsdp"), "sweep.strategies must be a list of strings, got 'fsdp'", None),
    ("bad-retries", launcher("retries=-1"), "retries must be an integer >= 0, got -1", None),
    ("bad-retry-shrink", launcher("retry_shrink=maybe"), "retry_shrink must be true or false, got 'maybe'", None),
    ("shrink-without-checkpoints", launcher("retry_shrink=true"), "retry_shrink=true needs checkpoints to resume "
     "from, but fsdp-F1-R1-S4 has train.checkpoint_every=0 (1 more run(s) too): set train.checkpoint_every=K", None),
    ("bad-train-value", launcher("train.lr=-1"), "train.lr must be > 0", None),
    ("bad-executor", launcher("cluster.executor=pbs"), "cluster.executor must be local or slurm, got 'pbs'", None),
    ("bad-placement-mode", launcher("cluster.placement=random"),
     "cluster.placement must be one of in_job, pinned, slurm", None),
    ("probe-iters-zero", launcher("action=probe", "probe.iters=0"), "probe.iters must be an integer >= 1, got 0",
     None),
    ("probe-unknown-key", launcher("action=probe", "+probe.sizes=4"), "unknown probe key(s): sizes", None),
    # ---- tensor and pipeline parallelism, and memory (refused while planning)
    ("tp-crosses-node", launcher("train.tp=3"), "train.tp=3 does not divide the 2 GPUs of a node: a tensor-parallel "
                                                "group must fit inside one node", None),
    ("tp-splits-heads", launcher("model=mini", "train.tp=2"), "train.tp=2 does not divide the model's 3 KV heads",
     None),
    ("sequence-parallel-without-tp", launcher("train.sequence_parallel=true"),
     "train.sequence_parallel=true splits the sequence over the tensor-parallel group, but train.tp=1", None),
    ("sequence-parallel-uneven", launcher("model=tiny", "train.tp=2", "train.seq_len=15",
                                          "train.sequence_parallel=true"),
     "train.sequence_parallel: train.seq_len=15 does not split evenly over train.tp=2 ranks", None),
    ("pp-more-than-layers", launcher("model=tiny", "train.pp=4"), "train.pp=4 stages but the model has only 2 layers",
     None),
    ("microbatches-fewer-than-stages", launcher("train.pp=2", "train.microbatches=1"),
     "train.microbatches=1 is fewer than train.pp=2 stages", None),
    ("batch-not-in-microbatches", launcher("train.pp=2", "train.microbatches=3"),
     "the 8 sequences of a data-parallel rank (train.batch_per_rank; the launcher multiplies it by tp x pp) do not "
     "divide into 3 microbatches", None),
    ("layout-exceeds-memory", launcher("cluster.gpu_memory_GB=0.001"), "fsdp-F1-R1-S4 needs 3.04 MB per device "
     "(state 419 kB, gathered 723 kB, activations 1.9 MB, buffers 0 B) but a device has 0.001 GB "
     "(cluster.gpu_memory_GB)", None),
    ("memory-reserve-above-device", launcher("cluster.gpu_memory_GB=1", "cluster.memory_reserve_GB=2"),
     "cluster.memory_reserve_GB must be a number >= 0 below cluster.gpu_memory_GB, or null, got 2", None),
    ("plan-dryrun-not-a-bool", launcher("plan.dryrun=maybe"), "plan.dryrun must be true or false, got 'maybe'", None),
    ("dryrun-exceeds-memory",
     launcher("action=dryrun", "cluster.gpu_memory_GB=0.004", "cluster.memory_reserve_GB=0.002"),
     "fsdp-F1-R1-S4: its dry-run peaks at 0.00256 GB per device but a device has 0.004 GB less 0.002 GB kept free "
     "(cluster.memory_reserve_GB) = 0.002 GB: shard more (S), split the model (train.tp, train.pp) or set "
     "train.activation_checkpointing=full", None),
    ("dryrun-host-sync-in-step", launcher("action=dryrun", "train.on_nonfinite=skip_step"),
     "fsdp-F1-R1-S4: dry-run of rank 0: a host sync in a training step: nonfinite.py:", None),
    ("shrink-with-model-parallel", launcher("retry_shrink=true", "train.checkpoint_every=2", "train.tp=2"),
     "retry_shrink=true resumes on fewer nodes by changing F, R or S, which a run with train.tp or train.pp > 1 "
     "(fsdp-F1-R1-S2-T2) cannot do yet", None),
    ("outer-unknown", launcher("train.outer=adam"), "train.outer must be one of fedavg, diloco, got 'adam'", None),
    ("outer-lr-zero", launcher("train.outer_lr=0"), "train.outer_lr must be a number > 0, got 0", None),
    ("outer-momentum-one", launcher("train.outer_momentum=1"), "train.outer_momentum must be in [0, 1), got 1", None),
    ("aggregation-dtype-unknown", launcher("train.aggregation_dtype=fp8"),
     "train.aggregation_dtype must be one of fp32, bf16, int8, got 'fp8'", None),
    ("int8-with-averaged-moments", launcher("train.aggregation_dtype=int8", "train.average_optimizer_state=true"),
     "train.aggregation_dtype=int8 compresses pseudo-gradients, which optimizer moments have none of", None),
    ("fragments-not-dividing-A", launcher("train.outer_fragments=3"),
     "train.outer_fragments=3 must divide A=2: one fragment is synced every A/N steps", None),
    ("delay-not-below-period", launcher("train.outer_delay=2"),
     "train.outer_delay=2 must be < A/outer_fragments = 2 steps: a fragment's exchange must land before", None),
    ("streamed-with-evaluations", launcher("train.outer_fragments=2", "train.eval_every=2"),
     "train.eval_every=2 needs every group to hold the same model, which with train.outer_fragments=2", None),
    ("eval-every-not-multiple-of-A", launcher("train.eval_every=3"),
     "train.eval_every=3 must be a multiple of A=2 for fl_fsdp", None),
    ("fault-step-not-below-steps", launcher("train.fault_step=6"),
     "train.fault_step=6 must be below train.steps=6: the fault comes after that step", None),
    ("fault-group-outside-F", launcher("train.fault_step=2", "train.fault_group=2"),
     "train.fault_group=2 names no federation group of fsdp-F1-R1-S4: its groups are 0 to 0", None),
    ("fault-tolerance-without-groups", launcher("train.fault_tolerance=groups"),
     "train.fault_tolerance=groups makes each federation group a failure domain, but fsdp has one group that is the "
     "whole run: use fl_fsdp or fl_hsdp", None),
    ("quorum-min-above-F", launcher("sweep.strategies=[fl_fsdp]", "train.fault_tolerance=groups", "train.quorum_min=3"),
     "train.quorum_min=3 is above F=2: no average could ever gather that many federation groups", None),
    ("fault-tolerance-not-built-with", launcher("sweep.strategies=[fl_fsdp]", "train.fault_tolerance=groups",
                                                "train.outer=diloco", "train.elastic=true"),
     "train.fault_tolerance=groups is built for FedAvg or DiLoCo of the whole model at each average; not yet with "
     "train.elastic=True", None),
    ("fault-tolerance-pinned", launcher("cluster=leonardo", "action=plan", "sweep=paper_table3",
                                        "sweep.strategies=[fl_fsdp]", "train.fault_tolerance=groups",
                                        "cluster.placement=pinned"),
     "fl_fsdp-F128-R1-S4-A8: train.fault_tolerance=groups submits a SLURM job per federation group, placed by SLURM "
     "(under one switch when a group spans nodes); cluster.placement=pinned orders one job's ranks with a hostfile: "
     "use cluster.placement=in_job", None),
    ("target-ppl-not-a-perplexity", launcher("train.target_ppl=0.5"),
     "train.target_ppl must be a perplexity > 1 or null, got 0.5", None),
    ("probe-file-missing", launcher("action=plan", "cluster.probe=/nonexistent/probe.json"),
     "cluster.probe=/nonexistent/probe.json: no such file (write one with action=probe)", None),
    ("wandb-mode", launcher("wandb.enabled=true", "wandb.mode=cloud"),
     "wandb.mode must be one of offline, online, disabled", None),
    # ---- layouts, A, F, sizes
    ("A-below-1", launcher("sweep.A=[0]"), "A (aggregation period in steps) must be an integer >= 1, got 0", None),
    ("sweep-axis-with-commas", launcher("sweep.A=8,16"), "sweep.A is one of the sweep's own axes and takes its values "
                                                         "as one list: sweep.A=[8,16] (no -m)", None),
    ("sweep-axis-swept-with-m", launcher("-m", "sweep.A=8,16"), "sweep.A cannot be swept with -m: it is one of the "
                                                                "sweep's own axes and takes its values as one list: "
                                                                "sweep.A=[8,16] (with or without -m)", None),
    ("F-not-dividing-nodes", launcher("sweep=paper_table3", "sweep.F=[3]", "sweep.paper_nodes=null"),
     "F=3 federation groups must be >= 2 and divide the 4 nodes", None),
    ("F-scales-to-fraction", launcher("sweep=paper_table3", "sweep.F=[80]"),
     "F=80 at 128 nodes scales to 2.5 groups at 4 nodes", None),
    ("F-not-dividing-paper-nodes", launcher("sweep=paper_table3", "sweep.F=[3]"),
     "F=3 federation groups do not divide sweep.paper_nodes=128, the node count the sweep's F refers to, so it has no "
     "proportion to keep at 4 nodes (it would become 2 groups): use an F that divides 128 (2, 4, 8, 16, 32, 64, 128), "
     "or sweep.paper_nodes=null and an F that divides 4 (2, 4)", None),
    ("too-many-ranks", launcher("sweep=paper_table3", "cluster.max_ranks=4"),
     "needs 8 ranks but cluster 'local' holds at most 4", None),
    ("too-many-nodes", launcher("sweep.nodes=[64]"), "asks for 64 nodes but cluster 'local' has 4", None),
    ("bad-node-count", launcher("sweep.nodes=[0]"), "sweep.nodes entries must be positive integers or 'all', got 0",
     None),
    ("bad-repeats", launcher("sweep.repeats=0"), "sweep.repeats must be a positive integer, got 0", None),
    ("empty-sweep", launcher("sweep.exclude=[{strategy:fsdp},{strategy:fl_fsdp}]"), "expands to no runs", None),
    ("bandwidth-missing-level", launcher("cluster.bandwidth_GBps=[1.4]", "action=plan"),
     "cluster.bandwidth_GBps needs 2 values (inside a node, then levels 0..0), got 1: give one GB/s per level, "
     "fastest first: [inside a node, under one level-0 switch (e.g. L0s0)]", None),
    ("bandwidth-increasing", launcher("cluster.bandwidth_GBps=[1,2]", "action=plan"),
     "cluster.bandwidth_GBps must be positive and not increase with level", None),
    ("bad-nodes-per-level", launcher("cluster.nodes_per_level=[2,4]", "action=plan"),
     "cluster.nodes_per_level must start at 1", None),
    # ---- SLURM cluster values and the sbatch script
    ("partition-missing", launcher("cluster=slurm", "action=plan"),
     "cluster.partition must be set (it is ??? in conf/)", None),
    ("partition-null", launcher("cluster=leonardo", "cluster.partition=null", "action=plan"),
     "cluster 'leonardo' has no partition", None),
    ("line-break-in-value", launcher("cluster=leonardo", "cluster.partition='gpu\nrm -rf ~'", "action=plan"),
     "cluster.partition contains a line break", None),
    ("line-break-in-setup", launcher("cluster=leonardo", "cluster.setup=['module load x\ntouch /tmp/x']",
                                     "action=plan"), "cluster.setup[0] contains a line break", None),
    ("setup-unbalanced-quote", launcher("cluster=leonardo", "cluster.setup=[\"source '/opt/env\"]", "action=plan"),
     "cluster.setup[0] cannot be split into words (No closing quotation)", None),
    ("sbatch-option-name", launcher("cluster=leonardo", "+cluster.sbatch_extra={x y: 1}", "action=plan"),
     "cluster.sbatch_extra key 'x y' is not an sbatch option name", None),
    ("sbatch-option-value", launcher("cluster=leonardo", "+cluster.sbatch_extra.comment={a: 1}", "action=plan"),
     "cluster.sbatch_extra.comment must be a single value", None),
    ("mem-without-unit", launcher("cluster=leonardo", "cluster.mem=480", "action=plan"),
     "cluster.mem=480 has no unit, so sbatch reads 480 MB per node: under 1 GB for each of its 4 tasks: write the "
     "unit, cluster.mem=480G for gigabytes", None),
    # ---- results paths stay inside results_dir
    ("sweep-name-slash", launcher("sweep.name=../escape", "action=plan"), "sweep.name '../escape' must be a plain "
                                                                          "directory name", None),
    ("sweep-name-dotdot", launcher("sweep.name=..", "action=plan"), "sweep.name '..' must be a plain directory name",
     None),
    ("sweep-name-empty", launcher("sweep.name=''", "action=plan"), "sweep.name '' must be a plain directory name",
     None),
    ("cluster-name-dotdot", launcher("cluster.name=..", "action=plan"),
     "cluster.name '..' must be a plain directory name", None),
    ("sweep-dir-symlink-out", launcher("action=plan"),
     "sweep.name directory {tmp}/results/local/smoke resolves to {tmp}/elsewhere, outside {tmp}/results/local",
     symlinked_sweep),
    # ---- topology text and hostlists (a snapshot directory)
    ("snapshot-missing", launcher("cluster=leonardo", "cluster.snapshot={tmp}/none", "action=plan"),
     "snapshot file {tmp}/none/topology.txt does not exist", None),
    ("snapshot-without-nodes", launcher(*SNAP), "snapshot file {tmp}/snap/nodes.txt does not exist",
     snapshot(nodes_file=False)),
    ("topology-garbage", launcher(*SNAP), "line 1: no Key=Value field in 'this is not scontrol output'",
     snapshot(topology="this is not scontrol output\n")),
    ("topology-bad-number", launcher(*SNAP), "line 1: Level= not a number ('x')",
     snapshot(topology="SwitchName=leaf01 Level=x LinkSpeed=1 Nodes=lrdn[0001-0004]\n")),
    ("hostlist-unclosed", launcher(*SNAP), "line 1: unclosed '[' at position 4 in hostlist 'lrdn[0001-0004'",
     snapshot(topology="SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0001-0004\n")),
    ("hostlist-trailing-text", launcher(*SNAP), "text '-ib' after the last ']'",
     snapshot(topology="SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0001-0004]-ib\n")),
    ("hostlist-descending", launcher(*SNAP), "descending range '0004-0001'",
     snapshot(topology="SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=lrdn[0004-0001]\n")),
    ("node-under-two-leaves", launcher(*SNAP), "node lrdn0004 is under two leaf switches: leaf01 and leaf02",
     snapshot(topology=TWO_LEAVES)),
    ("switch-unknown-child", launcher(*SNAP), "switch spine names unknown child switch leaf02",
     snapshot(topology=UNKNOWN_CHILD)),
    ("switch-cycle", launcher(*SNAP), "levels must increase upwards (or the switches form a cycle)",
     snapshot(topology=CYCLE)),
    ("nodes-garbage", launcher(*SNAP), "line 1: no Key=Value field", snapshot(nodes="garbage\n")),
    ("node-unknown-state", launcher(*SNAP), "node lrdn0002 has unknown state 'SLEEPY'",
     snapshot(nodes=_fixture("show_node_oneliner.txt").replace("State=IDLE", "State=SLEEPY", 1))),
    ("nodes-not-in-topology", launcher(*SNAP), "no node of `scontrol show node` appears in the topology",
     snapshot(nodes="NodeName=other1 State=IDLE Gres=gpu:4 Partitions=boost_usr_prod\n")),
    ("snapshot-line-cut-short", launcher(*SNAP, "cluster.placement=pinned"),
     "snapshot file {tmp}/snap/nodes.txt: line 9 ends without a line break, so the file was cut short inside it",
     snapshot(nodes=node_lines(8, cut="ThreadsPerCore"))),
    ("snapshot-record-cut-short", launcher(*SNAP), "snapshot file {tmp}/snap/nodes.txt: line 9: the record of node "
     "lrdn0009 stops at ThreadsPerCore= where the capture's other records go on (TmpDisk=, Weight=, Owner=, ...)",
     snapshot(nodes=node_lines(8, cut="ThreadsPerCore", rest=9))),
    ("snapshot-nodes-missing", launcher(*SNAP, "cluster.placement=pinned"),
     "snapshot file {tmp}/snap/nodes.txt has no record of 8 of the 16 nodes {tmp}/snap/topology.txt names "
     "(lrdn[0009-0016]; lrdn0009 is on its line 3)", snapshot(nodes=node_lines(8))),
    ("snapshot-nodes-empty", launcher(*SNAP, "cluster.gpus_per_node=8"),
     "snapshot file {tmp}/snap/nodes.txt holds no node record, but {tmp}/snap/topology.txt names 16 nodes",
     snapshot(nodes="")),
    ("snapshot-node-twice", launcher(*SNAP),
     "snapshot file {tmp}/snap/nodes.txt: line 17: a second record of node lrdn0004 (the first is on line 4)",
     snapshot(nodes=node_lines(16, again=3))),
    ("snapshot-not-utf8", launcher(*SNAP),
     "snapshot file {tmp}/snap/topology.txt: line 6 is not UTF-8 text (byte 0xff at column 16)",
     snapshot(topology=_fixture("show_topology.txt").encode().replace(b"cell2", b"cell\xff2"))),
    ("gpus-per-node-not-the-nodes", launcher(*SNAP, "cluster.gpus_per_node=8"),
     "cluster.gpus_per_node=8 but the nodes of partition boost_usr_prod have 4 GPUs (scontrol's Gres)", snapshot()),
    ("partition-not-on-cluster", launcher(*SNAP, "cluster.partition=gpu"),
     "partition 'gpu' does not exist on this cluster (scontrol's nodes are in boost_usr_prod)", snapshot()),
    # ---- environment
    ("no-sbatch", launcher("cluster=leonardo"), "`sbatch` is not on PATH", None),
    ("no-srun", launcher("cluster=leonardo"), "`srun` is not on PATH", tools(sbatch="")),
    ("no-scontrol", launcher("cluster=leonardo", "cluster.placement=pinned", "action=plan"),
     "cluster.placement=pinned needs the real topology", None),
    ("scontrol-fails", launcher("cluster=leonardo", "cluster.topology=live", "action=plan"),
     "scontrol show topology failed with exit code 1: slurm_load_topo error: Unable to contact slurm controller",
     tools(scontrol=FAIL_SCONTROL)),
    ("topology-mode", launcher("cluster=leonardo", "cluster.topology=guess", "action=plan"),
     "cluster.topology must be auto, live or ideal, got 'guess'", None),
    ("fewer-usable-nodes", launcher(*SNAP, "sweep=paper_table3", "cluster.nodes=16"),
     "needs 16 nodes of 4 GPUs but only 14 are usable; a federation group alone needs 16 nodes; to size the sweep "
     "to them, set cluster.nodes=14", snapshot()),
    ("no-free-nodes", launcher(*SNAP, "cluster.placement=pinned"), "needs 2 nodes of 4 GPUs but only 0 are usable",
     snapshot(nodes=states("ALLOCATED"))),
    ("all-nodes-down", launcher(*SNAP), "needs 2 nodes of 4 GPUs but only 0 are usable",
     snapshot(nodes=states("DOWN+DRAIN"))),
    ("unknown-topology-name", launcher(*SNAP, "cluster.topology_name=nvl72"),
     "unknown topology 'nvl72' (cluster.topology_name): this cluster has ib, nvl", both(snapshot(), topoconf)),
    ("group-larger-than-block", launcher("cluster=nvl72", "cluster.snapshot={tmp}/snap", "sweep=paper_table3",
                                         "sweep.F=[4]", "action=plan"),
     "fl_hsdp-F4-R32-S4-A8: a federation group of 32 nodes cannot sit inside one block of 18", nvl72),
    ("segment-cannot-be-met", launcher("cluster=nvl72", "cluster.snapshot={tmp}/snap",
                                       "+cluster.sbatch_extra.segment=20", "action=plan"),
     "cluster.sbatch_extra.segment=20 cannot be met for fsdp-F1-R1-S8: blocks hold 18 nodes", nvl72),
    ("testbed-outside-namespace", launcher("cluster=testbed", "action=plan"),
     "must be used from network namespace fsb-hub", None),
    ("sweep-locked", launcher(), "another launcher (pid 4242) is running on {tmp}/results/local/smoke", locked_sweep),
    ("manifest-malformed", launcher("action=plan"),
     "{tmp}/results/local/smoke/manifest.jsonl:1 is not a manifest entry",
     results_file("manifest.jsonl", "not json\n")),
    # ---- the training entrypoint: spec files, layouts, A, F, keys
    ("spec-missing", train(), "spec file {tmp}/spec.json does not exist", spec_file(None)),
    ("spec-not-json", train(), "spec file {tmp}/spec.json is not valid JSON", spec_file("{not json")),
    ("spec-not-object", train(), "the spec must be a JSON object", spec_file("[1, 2]")),
    ("spec-missing-key", train(strategy=None), "spec is missing required key(s): strategy", None),
    ("spec-unknown-key", train(batch=4), "unknown spec key(s): batch", None),
    ("spec-unknown-train-key", train(train={"batch": 4}), "unknown train key(s): batch", None),
    ("spec-bad-steps", train(train={"steps": 0}), "train.steps must be a positive integer, got 0", None),
    ("spec-unknown-strategy", train(strategy="diloco"), "unknown strategy 'diloco'", None),
    ("spec-fsdp-with-F", train(F=2), "fsdp needs F = 1 and R = 1", None),
    ("spec-hsdp-with-F", train(strategy="hsdp", F=2), "hsdp needs F = 1", None),
    ("spec-fl_fsdp-with-R", train(strategy="fl_fsdp", F=2, R=2, A=2), "fl_fsdp needs R = 1", None),
    ("spec-F-1", train(strategy="fl_fsdp", A=2), "fl_fsdp needs F >= 2 federation groups, got F = 1", None),
    ("spec-A-missing", train(strategy="fl_fsdp", F=2), "A (aggregation period in steps) must be an integer >= 1, "
                                                        "got None", None),
    ("spec-A-zero", train(**{**FL2, "A": 0}), "A (aggregation period in steps) must be an integer >= 1, got 0", None),
    ("out-dir-blocked", train(out_dir="{tmp}/results/local/smoke/run"),  # results/local/smoke is a regular file
     "out_dir {tmp}/results/local/smoke/run cannot be created: Not a directory", results_file("", "")),
    ("ranks-mismatch", train(**FL2), "F*R*S = 2*1*1 = 2 but the launcher started 1 rank(s) (single)", None),
    ("spec-unknown-preset", train(model={"preset": "huge"}), "unknown model preset 'huge'", None),
    ("spec-unknown-model-key", train(model={"preset": "tiny", "hiden_size": 8}), "unknown model key(s): hiden_size",
     None),
    ("spec-unknown-data-kind", train(data={"kind": "csv"}), "unknown data kind 'csv'", None),
    # ---- data and tokenizer paths
    ("data-path-missing", train(data={**TEXT, "paths": ["{tmp}/none.txt"]}), "data path does not exist: {tmp}/none.txt",
     text_data("a.txt", "w1 w2")),
    ("data-unsupported-file", train(data={**TEXT, "paths": ["{tmp}/data/a.csv"]}),
     "unsupported data file {tmp}/data/a.csv", text_data("a.csv", "w1,w2")),
    ("data-no-text-files", train(data=TEXT), "no .txt/.jsonl/.parquet files found in {tmp}/data",
     text_data("empty_dir")),
    ("data-bad-jsonl", train(data=TEXT), "{tmp}/data/a.jsonl:1: line is not valid JSON",
     text_data("a.jsonl", "{oops\n")),
    ("data-too-small", train(data=TEXT), "yields 0 tokens = 0 blocks of seq_len 16; need at least 2",
     text_data("a.txt", "")),
    ("tokenizer-missing", train(data={**TEXT, "tokenizer": "{tmp}/no_tokenizer"}),
     "tokenizer directory does not exist: {tmp}/no_tokenizer", text_data("a.txt", "w1 w2")),
    ("tokenizer-unloadable", train(data={**TEXT, "tokenizer": "{tmp}/tok"}), "cannot load tokenizer from {tmp}/tok",
     both(text_data("a.txt", "w1 w2"), broken_tokenizer)),
    ("launcher-data-path-missing", launcher("data=text", "data.paths=[{tmp}/none.txt]", "data.tokenizer={TOKENIZER}"),
     "data path does not exist: {tmp}/none.txt", None),
    ("launcher-tokenizer-missing", launcher("data=text", "data.paths=[{tmp}/data]", "data.tokenizer={tmp}/no_tok"),
     "data.tokenizer directory does not exist: {tmp}/no_tok", text_data("a.txt", "w1 w2")),
    ("tokens-not-prepared", launcher("data=tokens", "data.path={tmp}/none"),
     "{tmp}/none holds no index.json: prepare it first (python -m train.data.prepare", None),
    ("tokens-other-tokenizer", launcher("data=tokens", "data.path={tmp}/tokens", "data.tokenizer={tmp}/tok2"),
     "data.tokenizer {tmp}/tok2 (hash ", both(prepared_tokens(), edited_tokenizer)),
    ("tokens-truncated-shard", launcher("data=tokens", "data.path={tmp}/tokens"), "is truncated (",
     prepared_tokens(truncate=True)),
    ("tokens-vocab-too-large", launcher("data=tokens", "data.path={tmp}/tokens", "+model.vocab_size=100"),
     "was tokenized with a vocabulary of 122 but the model has 100 embeddings", prepared_tokens()),
    ("tokens-corpus-too-small", launcher("data=tokens", "data.path={tmp}/tokens", "train.seq_len=64"),
     "fewer than one global batch of 16 sequences", prepared_tokens()),
    ("prepare-not-tokens", launcher("action=prepare", "data=synthetic"),
     "action=prepare writes a data=tokens directory, but data.kind is 'synthetic'", None),
    ("prepare-sources-not-a-list", launcher("action=prepare", "data=tokens", "data.path={tmp}/out",
                                            "data.tokenizer={TOKENIZER}", "prepare.sources={tmp}/corpus"),
     "prepare.sources must be a list of strings, got '{tmp}/corpus' (on the command line: prepare.sources=[a,b])",
     None),
    ("prepare-no-sources", launcher("action=prepare", "data=tokens", "data.path={tmp}/out",
                                    "data.tokenizer={TOKENIZER}"), "action=prepare needs prepare.sources=[PATH,...]",
     None),
    ("prepare-other-tokenizer", launcher("action=prepare", "data=tokens", "data.path={tmp}/tokens",
                                         "data.tokenizer={tmp}/tok2", "prepare.sources=[{tmp}/corpus]"),
     "{tmp}/tokens was prepared with tokenizer ", both(prepared_tokens(), edited_tokenizer)),
    # ---- action=export: a run's model as a Hugging Face directory
    ("export-without-run", launcher("action=export"), "action=export needs run=RUN_ID (action=status lists the "
                                                      "sweep's runs)", None),
    ("export-unknown-run", launcher("action=export", "run=nope"),
     "run=nope is not a run of sweep smoke on cluster local; its runs: fsdp-F1-R1-S4, fl_fsdp-F2-R1-S2-A2", None),
    ("export-no-checkpoint", launcher("action=export", "run=fsdp-F1-R1-S4"),
     "fsdp-F1-R1-S4 has no checkpoint to export ({tmp}/results/local/smoke/fsdp-F1-R1-S4/checkpoints holds none): a "
     "run trained with train.checkpoint_every=K makes one every K steps and after its last step", earlier_run()),
    ("export-out-not-empty", launcher("action=export", "run=fsdp-F1-R1-S4"),
     "export.out={tmp}/results/local/smoke/fsdp-F1-R1-S4/hf exists and is not empty: name a new or empty directory",
     both(earlier_run(), exported_before)),
    # ---- run identity: results of another experiment are never reused
    ("other-experiment", launcher("model=tiny"),
     "{tmp}/results/local/smoke/fsdp-F1-R1-S4 holds a run of another experiment (model.preset: 'small' -> 'tiny'); "
     "1 more run(s) differ too: use another results_dir, or delete these run directories to run afresh",
     earlier_run("model=small")),
    ("other-experiment-train-key", launcher("train.steps=9"), "(train.steps: 6 -> 9)", earlier_run()),
    ("other-experiment-rank-order", launcher("cluster.placement=slurm"), "(rank_order: 'topology' -> 'slurm')",
     results_file("manifest.jsonl", '{"run_id": "fsdp-F1-R1-S4", "attempts": 1, "state": "COMPLETED", '
                                    '"cluster": "local", "rank_order": "topology"}\n')),
    ("preflight-fraction", launcher("action=preflight", "preflight.fraction=2"),
     "preflight.fraction must be a number in (0, 1), got 2", None),
    ("legacy-first-repeat", launcher("sweep.repeats=2"),
     "{tmp}/results/local/smoke/fsdp-F1-R1-S4-rep1 holds repeat 1 of fsdp-F1-R1-S4 as an earlier fedshard named it; "
     "this one names it fsdp-F1-R1-S4: rename the directory", results_file("fsdp-F1-R1-S4-rep1/spec.json", "{}")),
    # ---- rendezvous (loopback only)
    ("rendezvous-unreachable", train(**FL2), "rank 1 of 2: nothing answers at the rendezvous tcp://127.0.0.1:{port} "
                                             "(rank 0's address, from MASTER_ADDR/MASTER_PORT) after "
                                             "train.timeout_s=1 s", env(**RANK1_OF_2)),
    ("rendezvous-never-published", train(**FL2), "rank 1: rank 0 did not publish its address in "
                                                 "{tmp}/run/.rendezvous-slurm-4242-0-0 within 1 s",
     env(**SLURM_RANK1_OF_2)),
    ("rendezvous-stale-file", train(**FL2), "nothing answers at the rendezvous tcp://127.0.0.1:{port} (rank 0's "
                                            "address, from {tmp}/run/.rendezvous-slurm-4242-0-0)",
     both(env(**SLURM_RANK1_OF_2), rendezvous_file)),
    ("master-port-invalid", train(**FL2), "MASTER_PORT must be a port number (1-65535), got 'http'",
     env(**{**RANK1_OF_2, "MASTER_PORT": "http"})),
]
IDS = [case[0] for case in CASES]


def _base_spec(tmp: Path) -> dict:
    return {"strategy": "fsdp", "F": 1, "R": 1, "S": 1, "out_dir": str(tmp / "run"), "model": {"preset": "tiny"},
            "train": {"steps": 2, "seq_len": 16, "log_every": 1, "timeout_s": 1}}


def _fill(value, subs: dict):
    if isinstance(value, str):
        for key, sub in subs.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, list):
        return [_fill(v, subs) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, subs) for k, v in value.items()}
    return value


def _files(root: Path) -> dict:
    """Every file under root (links not followed) -> its bytes: what "nothing written" compares."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _dead_port(ctx: Ctx) -> int:
    """A loopback port bound but never listening: connecting is refused, and no one else can take it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    ctx.held.append(sock)
    return sock.getsockname()[1]


def _environment(ctx: Ctx, subs: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SUBMITIT_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC"))}
    path = [PYTHON_ONLY]
    if ctx.tools:
        bin_dir = ctx.tmp / "bin"
        bin_dir.mkdir()
        for name, body in ctx.tools.items():
            tool = bin_dir / name
            tool.write_text(f"#!/bin/sh\necho \"{name} $*\" >> {ctx.tmp / 'calls.log'}\n{body}")
            tool.chmod(0o755)
        path.insert(0, str(bin_dir))
    env.update(PATH=os.pathsep.join(path), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update({k: _fill(v, subs) for k, v in ctx.env.items()})
    return env


@pytest.mark.parametrize("case_id,command,message,prepare", CASES, ids=IDS)
@pytest.mark.slow
def test_bad_input(tmp_path, tiny_tokenizer, case_id, command, message, prepare):
    ctx = Ctx(tmp=tmp_path, tokenizer=tiny_tokenizer)
    ctx.port = _dead_port(ctx)
    if prepare:
        prepare(ctx)
    subs = {"tmp": str(tmp_path), "port": str(ctx.port), "TOKENIZER": str(tiny_tokenizer)}
    kind, args = command
    if kind == "launcher":
        argv = ["-m", "launcher", *_fill(args, subs), f"results_dir={ctx.results}"]
    else:
        if ctx.spec_path is None:
            spec = _base_spec(tmp_path)
            for key, value in _fill(args, subs).items():
                if value is None:
                    spec.pop(key)
                elif key == "train":
                    spec["train"].update(value)
                else:
                    spec[key] = value
            ctx.spec_path = tmp_path / "spec.json"
            ctx.spec_path.write_text(json.dumps(spec))
        argv = ["-m", "train", str(ctx.spec_path)]
    before = {"results": _files(ctx.results), "run": _files(ctx.run), "elsewhere": _files(tmp_path / "elsewhere")}
    try:
        proc = forked.run(*argv[1:], cwd=tmp_path, env=_environment(ctx, subs), timeout=120)
    finally:
        for obj in ctx.held:
            obj.close()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("fedshard: error: "), proc.stderr[-3000:]
    assert _fill(message, subs) in lines[0], lines[0]
    # Nothing submitted, nothing (half-)written: results and run directories exactly as prepared.
    calls = tmp_path / "calls.log"
    assert not calls.exists() or "sbatch" not in calls.read_text()
    after = {"results": _files(ctx.results), "run": _files(ctx.run), "elsewhere": _files(tmp_path / "elsewhere")}
    assert after == before
    assert not list(tmp_path.rglob("result.json")) and not list(tmp_path.rglob("plan.json"))


def test_readme_table_lists_every_case_once():
    """docs/troubleshooting.md's table and this file's table: the same ids, one row each, in the same order."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    section = text.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    ids = [re.match(r"\| `([^`]+)` \|", row).group(1) for row in rows]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert len(IDS) == len(set(IDS)), sorted({i for i in IDS if IDS.count(i) > 1})
    assert ids == IDS, (sorted(set(IDS) - set(ids)), sorted(set(ids) - set(IDS)))
    assert all(row.count("|") >= 4 for row in rows)  # id | input | message names
