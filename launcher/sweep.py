"""Expand a sweep (strategy x A x F x nodes x tp x pp x repeats, minus exclusions) into run specs.

Layouts follow the paper's rules: S = GPUs per node (sharding stays inside a node).
FSDP shards over all N ranks; HSDP replicates across nodes; FL+FSDP makes every
node a federation group; FL+HSDP splits the nodes into F groups of R nodes. With
tp x pp > 1 each shard is a pipeline of pp stages of tp GPUs: a node holds G / (tp x pp)
shards, or a shard spans (tp x pp) / G nodes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from launcher.placement.allocate import Placement, check_model_parallel, shards_per_node
from launcher.settings import Settings
from train.contract import token_index
from train.contract.common import ConfigError, FedshardError
from train.contract.layout import STRATEGIES, Layout
from train.contract.sections import TextData, TokensData, data_to_dict
from train.contract.spec import RunSpec


@dataclass
class Run:
    """One run of the sweep: the spec train/ gets, plus the node count the scheduler needs."""

    spec: RunSpec
    nodes: int
    note: str = ""

    @property
    def run_id(self) -> str:
        return self.spec.run_id


@dataclass(frozen=True)
class PlannedRun:
    """A run placed on the cluster's topology (launcher.planning.place_runs), handed to plan.json and to submission."""

    run: Run
    placement: Placement
    leaves: int | None  # leaf switches (or blocks) the placement spans, when the topology is the real one
    topology_request: dict = field(default_factory=dict)  # sbatch --switches or --segment
    # (launcher.planning.topology_request)


def layout(strategy: str, nodes: int, gpus_per_node: int, F: int | None, A: int | None, tp: int = 1,
           pp: int = 1) -> Layout:
    """A strategy's layout on `nodes` nodes (the paper's rules: module docstring), each shard being pp x tp GPUs."""
    check_model_parallel(tp, gpus_per_node)
    grid = shards_per_node(nodes, gpus_per_node, pp, tp)
    if grid is None:
        raise ConfigError(f"pp*tp = {pp}*{tp} = {pp * tp} GPUs per shard neither divide a node's {gpus_per_node} "
                          f"GPUs nor fill whole nodes of the {nodes}")
    nodes, S = grid
    try:
        return Layout(strategy, *STRATEGIES[strategy].grid(nodes, S, F), A=A, P=pp, T=tp)
    except (ValueError, FedshardError) as exc:
        raise ConfigError(str(exc)) from None


def scaled_F(F: int, nodes: int, paper_nodes: int | None) -> tuple[int, str]:
    """F at this node count: the sweep's F refers to `paper_nodes`; smaller clusters keep the proportion."""
    if not paper_nodes or nodes >= paper_nodes:
        return F, ""
    exact = F * nodes / paper_nodes
    scaled = max(2, int(exact))
    if exact >= 2 and exact != int(exact):
        raise ConfigError(f"F={F} at {paper_nodes} nodes scales to {exact:g} groups at {nodes} nodes; "
                          f"set sweep.F explicitly")
    if paper_nodes % F:  # no proportion to keep: F=3 of 128 nodes would silently become 2 groups here
        fits = [str(f) for f in range(2, paper_nodes + 1) if paper_nodes % f == 0]
        here = [str(f) for f in range(2, nodes + 1) if nodes % f == 0]
        raise ConfigError(f"sweep.F: F={F} federation groups do not divide sweep.paper_nodes={paper_nodes}, the node "
                          f"count the sweep's F refers to, so it has no proportion to keep at {nodes} nodes (it would "
                          f"become {scaled} groups): use an F that divides {paper_nodes} ({', '.join(fits)}), or "
                          f"sweep.paper_nodes=null and an F that divides {nodes} ({', '.join(here) or 'none'})")
    return scaled, f"F scaled {F}->{scaled} ({paper_nodes}->{nodes} nodes)"


def _node_counts(settings: Settings) -> list[int]:
    out = []
    for n in settings.sweep.nodes:
        n = settings.cluster.nodes if n == "all" else n
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"sweep.nodes entries must be positive integers or 'all', got {n!r}")
        if n > settings.cluster.nodes:
            raise ConfigError(f"sweep {settings.sweep.name!r} asks for {n} nodes but cluster "
                              f"{settings.cluster.name!r} has {settings.cluster.nodes}")
        out.append(n)
    return out


def per_pipeline(train: dict, tp: int, pp: int) -> dict:
    """The train settings of a run with these degrees. train.batch_per_rank counts sequences per GPU, as in the
    paper; a data-parallel rank of tp x pp GPUs takes tp x pp times as many, so every layout on the same GPUs
    trains the same global batch."""
    return {**train, "tp": tp, "pp": pp, "batch_per_rank": train["batch_per_rank"] * tp * pp}


SCALINGS = ("none", "weak", "strong")


def per_gpu_batches(settings: Settings, counts: list[int]) -> dict[int, int]:
    """train.batch_per_rank (sequences per GPU) at each node count: the same everywhere, except under
    sweep.scaling=strong, which keeps the global batch of the smallest count and splits it over more GPUs."""
    scaling, batch = settings.sweep.scaling, settings.train.batch_per_rank
    if scaling not in SCALINGS:
        raise ConfigError(f"sweep.scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    if scaling != "none" and len(set(counts)) < 2:
        raise ConfigError(f"sweep.scaling={scaling} compares node counts: sweep.nodes needs at least two, got "
                          f"{counts}")
    if scaling != "strong":
        return {n: batch for n in counts}
    gpus = settings.cluster.gpus_per_node
    smallest = min(counts)
    sequences = batch * smallest * gpus
    uneven = [n for n in counts if sequences % (n * gpus)]
    if uneven:
        raise ConfigError(f"sweep.scaling=strong keeps the global batch of {sequences} sequences (batch_per_rank "
                          f"{batch} x {smallest * gpus} GPUs on {smallest} node(s)), which {uneven[0] * gpus} GPUs "
                          f"on {uneven[0]} nodes cannot split evenly")
    return {n: sequences // (n * gpus) for n in counts}


def _degrees(values: list, key: str, settings: Settings) -> list[int]:
    """sweep.tp / sweep.pp, or the train setting when the sweep does not vary it (an empty list)."""
    values = values or [getattr(settings.train, key)]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise ConfigError(f"sweep.{key} must be a list of positive integers, got {values!r}")
    return values


def _excluded(point: dict, exclude: list) -> bool:
    return any(all(point.get(k) == v for k, v in rule.items()) for rule in exclude)


def expand(settings: Settings, point: dict[str, str] | None = None) -> list[Run]:
    """Every run of the sweep, validated (a bad one stops the whole sweep before submission), repeats
    interleaved round-robin. `point`: the values a multirun gave its swept keys, in the order typed
    (launcher.multirun), which `settings` were composed with; the specs carry them (and their run ids name them)."""
    sweep = settings.sweep
    model, data = settings.model, settings.data
    if isinstance(data, TextData):
        data.files()  # a typo in a path fails now, not after a queue wait
    prepared = token_index.load(data.path, data.tokenizer) if isinstance(data, TokensData) else None
    unknown = [s for s in sweep.strategies if s not in STRATEGIES]
    if unknown:
        raise ConfigError(f"unknown strategy {unknown[0]!r} in sweep {sweep.name!r}; "
                          f"expected one of {', '.join(STRATEGIES)}")
    if not isinstance(sweep.repeats, int) or sweep.repeats < 1:
        raise ConfigError(f"sweep.repeats must be a positive integer, got {sweep.repeats!r}")
    repeated: list[tuple[int, Run]] = []  # (repeat, run)
    parallel = [(tp, pp) for tp in _degrees(sweep.tp, "tp", settings) for pp in _degrees(sweep.pp, "pp", settings)]
    counts = _node_counts(settings)
    batches = per_gpu_batches(settings, counts)
    for nodes in counts:
        for strategy in sweep.strategies:
            As = sweep.A if STRATEGIES[strategy].federated else [None]
            Fs = sweep.F if STRATEGIES[strategy].chooses_F else [None]
            for F_asked, A, (tp, pp) in ((F_, A, mp) for F_ in Fs for A in As for mp in parallel):
                F, note = scaled_F(F_asked, nodes, sweep.paper_nodes) if F_asked is not None else (None, "")
                where = {"strategy": strategy, "A": A, "F": F_asked, "nodes": nodes, "tp": tp, "pp": pp}
                if _excluded(where, sweep.exclude):
                    continue
                runs_here = [_run(settings, layout(strategy, nodes, settings.cluster.gpus_per_node, F, A, tp, pp),
                                  nodes, note, rep, point or {}, batches[nodes])
                             for rep in range(1, sweep.repeats + 1)]
                if prepared is not None:  # a prepared directory too small or of another vocabulary: refused now
                    _feeds(prepared, data, model.llama_kwargs["vocab_size"], runs_here[0].spec)
                repeated += list(enumerate(runs_here, 1))
    # round-robin: every configuration's first repeat, then every second one..., so that drift on the machine
    # (load, thermal, a noisy neighbour) spreads over all configurations instead of favouring the early ones
    runs = [run for _, run in sorted(repeated, key=lambda pair: pair[0])]
    if not runs:
        raise ConfigError(f"sweep {sweep.name!r} expands to no runs (check strategies and exclude)")
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"sweep {sweep.name!r} has duplicate runs: {sorted({i for i in ids if ids.count(i) > 1})}")
    return runs


def _feeds(index: dict, data: TokensData, vocab: int, spec: RunSpec) -> None:
    cfg = spec.train
    try:
        token_index.check_run(index, data.path, vocab, cfg.seq_len, spec.layout.dp_world * cfg.batch_per_rank,
                              cfg.steps, data.epochs)
    except FedshardError as exc:
        raise ConfigError(f"{spec.run_id}: {exc}") from None


def _run(settings: Settings, grid: Layout, nodes: int, note: str, rep: int, point: dict[str, str],
         batch: int) -> Run:
    """Repeat `rep` of `grid` on `nodes` nodes at a multirun `point`: its spec (seed + rep - 1, so repeats measure
    run-to-run spread), in <sweep_dir>/<run id>."""
    cluster = settings.cluster
    if cluster.max_ranks is not None and grid.world > cluster.max_ranks:
        raise ConfigError(f"{grid.strategy} on {nodes} nodes needs {grid.world} ranks but cluster {cluster.name!r} "
                          f"holds at most {cluster.max_ranks} (cluster.max_ranks)")
    train = per_pipeline({**asdict(settings.train), "batch_per_rank": batch}, grid.T, grid.P)
    peak = cluster.peak_flops_fp8 if settings.train.float8 else cluster.peak_flops  # MFU against what it runs
    raw = {"strategy": grid.strategy, "F": grid.F, "R": grid.R, "S": grid.S, "A": grid.A, "out_dir": "pending",
           "model": settings.model.to_dict(), "data": data_to_dict(settings.data), "train": train,
           "device": cluster.device, "backend": cluster.backend, "peak_flops": peak,
           "axes": dict(point), "repeat": rep, "rank_order": cluster.rank_order}
    try:
        spec = RunSpec.from_dict(raw)  # out_dir follows from the run id
    except FedshardError as exc:
        raise ConfigError(f"{grid.strategy} (F,R,S)=({grid.F},{grid.R},{grid.S}): {exc}") from None
    spec.train.seed += rep - 1  # checked by the spec first: repeats differ in seed, so they measure spread
    spec.out_dir = str(settings.sweep_dir / spec.run_id)
    return Run(spec=spec, nodes=nodes, note=note)
