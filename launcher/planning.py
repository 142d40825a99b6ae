"""What a sweep's runs are planned as, before anything is written: each run placed on the cluster's topology, its
communication (the paper's model), step time (launcher.prediction), memory per device and sbatch script
(PlanEntry), and every layout on the widest run's nodes ranked (Plan). action=plan writes and prints it
(launcher.actions.plan); action=run submits the placed runs."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from launcher import fault_tolerance, shrink
from launcher import scheduler as schedulers
from launcher.placement import allocate, gc_paused, memory, steptime, topology
from launcher.placement import ranking as planner
from launcher.placement.costmodel import Model, checkpoint_bytes, model_from_preset, predict
from launcher.placement.memory import human_bytes
from launcher.placement.steptime import Activations, Shapes, StepTime
from launcher.prediction import Predictor, Workload
from launcher.settings import Settings
from launcher.settings.secrets import redact, redacted
from launcher.slurm import hardware
from launcher.submit import attempt_folder, require_netns
from launcher.sweep import PlannedRun, Run, expand
from train.contract.common import ConfigError
from train.contract.layout import Layout

GB = 1e9


@dataclass(frozen=True)
class PlanEntry:
    """One run as plan.json shows it (report/write.py reads it back from there): layout, placement, prediction."""

    run_id: str
    layout: Layout                        # plan.json spells it strategy, F, R, S, A, tp and pp
    world_size: int
    gpus_per_node: int
    model: dict
    model_params: int
    train: dict
    note: str
    nodes: list[str]
    hostfile: list[str]
    coords: list[list[int]]               # [f, r, s, p, t] of every rank (train.parallel.dims)
    bandwidth: dict
    group_levels: list[int]
    hierarchy_ok: bool
    predicted_comm_s: float
    predicted_ratio_to_fsdp: float | None
    predicted_step_s: float               # the step-time model's estimate (launcher.placement.steptime)
    predicted_first_step_s: float | None  # the first step: the steady one and its communicators' first calls
    predicted_step_bounds_s: list[float]  # [full overlap, no overlap]
    predicted_compute_s: float | None
    predicted_comm_by_group_s: dict       # shard, replicate, federation (amortised over A)
    predicted_exposed_comm_s: dict        # what the schedule leaves exposed: by group kind, and "by_level"
    predicted_tokens_per_s: float
    predicted_speedup_over_fsdp: float | None
    compute_source: str
    checkpoint_bytes: int
    memory_per_device: dict               # bytes at the peak, by kind (launcher.placement.memory)
    memory: dict                          # model_bytes, dryrun_peak_bytes, dryrun_after_training_bytes (null
                                          # without a dry-run: launcher.actions.dryrun), reserve_bytes, device_bytes
    resources: dict
    sbatch: str | None  # SLURM clusters only

    def to_json(self) -> dict:
        """This run's object in plan.json: the fields, in their order, as keys (the layout's as plan.json has
        always spelt them)."""
        L = self.layout
        rest = {k: v for k, v in asdict(self).items() if k not in ("run_id", "layout")}
        return {"run_id": self.run_id, "strategy": L.strategy, "F": L.F, "R": L.R, "S": L.S, "A": L.A, "tp": L.T,
                "pp": L.P, **rest}


def comm_model(run: Run) -> Model:
    """Bytes the cost model moves: the run's Llama shapes in its communication precision."""
    t = run.spec.train
    return model_from_preset(run.spec.model.llama_kwargs, t.precision, t.average_optimizer_state, t.aggregation_dtype,
                             t.reduce_dtype)


def node_share(cluster) -> tuple[int, int]:
    """(GPUs, CPUs) one node must have free for a job: its GPUs on a GPU cluster, and cluster.cpus_per_task (1
    when unset) per task, tasks being one per GPU slot."""
    return (cluster.gpus_per_node if cluster.device == "cuda" else 0), cluster.gpus_per_node * (cluster.cpus_per_task
                                                                                                or 1)


def usable_nodes(settings: Settings, topo: topology.Topology, runs: list[Run]) -> tuple[list[str], dict]:
    """The nodes plans use and what the plan says about the others: only nodes whose free GPUs and CPUs hold
    one node's share (pinned jobs name their nodes, which must be free now). In-job placement happens on
    what SLURM gives when the job starts: when fewer nodes than the widest run needs are free now, it plans
    on every node that is not down or drained, and says so (the job then waits for busy ones)."""
    free, excluded = topo.free(*node_share(settings.cluster))
    needed = max(run.nodes for run in runs)
    nodes = {"free": len(free), "excluded": {why: len(names) for why, names in excluded.items()},
             "examples": {why: names[:3] for why, names in excluded.items()}, "note": None}
    if settings.cluster.placement == "pinned" or len(free) >= needed:
        return free, nodes
    usable = topo.usable(now=False)
    nodes["note"] = (f"only {len(free)} node(s) are free now and the widest run needs {needed}: the in-job plan "
                     f"uses the {len(usable)} nodes not down or drained, and the job waits for busy ones")
    return usable, nodes


def place_runs(settings: Settings, runs: list[Run]) -> tuple[topology.Topology, str, list[str], list[PlannedRun],
                                                             dict]:
    """(topology, its source, usable nodes, every run placed on them, what was excluded and why: usable_nodes);
    plan() saves the topology as topology.json for jobs and reports."""
    require_netns(settings.cluster)
    scheduler = schedulers.of(settings.cluster)
    topo, source, real = scheduler.topology()
    if real:
        hardware.check(settings.cluster, [node for node in topo.nodes.values() if node is not None])
    if settings.cluster.placement == "pinned" and scheduler.reads_topology and not real:
        raise ConfigError("cluster.placement=pinned needs the real topology: set cluster.snapshot=DIR "
                          "(slurm/capture.sh) or run where scontrol works")
    usable, nodes = usable_nodes(settings, topo, runs)
    return topo, source, usable, [place_one(settings.cluster, topo, real, usable, run) for run in runs], nodes


def widest_run(settings: Settings, runs: list[Run] | None = None) -> tuple[topology.Topology, list[PlannedRun],
                                                                            PlannedRun]:
    """The sweep's runs (expand(settings) unless given) placed, and the widest of them: the probe and the preflight
    run on its nodes, which hold every run's."""
    topo, _, _, planned, _ = place_runs(settings, expand(settings) if runs is None else runs)
    return topo, planned, max(planned, key=lambda p: p.run.spec.world_size)


def place_one(cluster, topo: topology.Topology, real: bool, usable: list[str], run: Run) -> PlannedRun:
    """`run` placed on `usable` nodes of `topo` (`real`: SLURM's own topology), with its sbatch topology request."""
    layout, G = run.spec.layout, cluster.gpus_per_node
    placement = allocate.place(layout, G, topo, usable)
    slurm_order = cluster.placement == "slurm"
    if slurm_order:
        placement = allocate.in_slurm_order(placement, layout, G, topo)
    # --switches on SLURM's own tree only, and not when SLURM's order is kept: the paper asked for no switches
    count_leaves = real and not slurm_order  # real: a topology the scheduler itself reads
    leaves = len({topo.parent[n] for n in placement.nodes}) if count_leaves else None
    return PlannedRun(run, placement, leaves, topology_request(cluster, topo, run, leaves))


def topology_request(cluster, topo: topology.Topology, run: Run, leaves: int | None) -> dict:
    """What an in-job run asks SLURM for so that it lands low in the topology: on a tree, --switches=K@wait (K =
    the leaves the plan spans); on blocks, --segment=K (K = one federation group's nodes, the whole job for
    FSDP/HSDP) when a group spans several nodes and fits the smallest block. On blocks, an FL+HSDP group no
    block can hold, or a sbatch_extra.segment that none can, is refused."""
    group_nodes, _ = allocate.units(run.spec.layout, cluster.gpus_per_node)
    if topo.block_size:
        row = run.spec.layout.row
        if row.federated and row.replicated and group_nodes > topo.block_size:
            raise ConfigError(f"{run.run_id}: a federation group of {group_nodes} nodes cannot sit inside one block "
                              f"of {topo.block_size}, so its replicas would cross blocks every step; choose F so that "
                              f"{run.nodes} / F <= {topo.block_size} (sweep.F)")
        asked = cluster.sbatch_extra.get("segment")
        if asked is not None and (int(asked) > topo.block_size or run.nodes % int(asked)):
            raise ConfigError(f"cluster.sbatch_extra.segment={asked} cannot be met for {run.run_id}: blocks hold "
                              f"{topo.block_size} nodes and the run needs {run.nodes} (a multiple of the segment)")
    elif leaves is not None and "segment" in cluster.sbatch_extra:
        raise ConfigError("cluster.sbatch_extra.segment needs a block topology (topology/block); this cluster's "
                          "is a tree")
    if leaves is None or cluster.placement != "in_job":
        return {}
    if not topo.block_size:
        return {"switches": f"{leaves}@{cluster.switches_wait_min:02d}:00"}
    fits = 1 < group_nodes <= topo.block_size and run.nodes % group_nodes == 0
    return {"segment": group_nodes} if fits else {}


def spread(run: Run, layout: Layout) -> tuple[float, int]:
    """Sequences per data-parallel rank and microbatches of `run`'s global batch in `layout`: the run's own
    where the layout is the run's; else the global batch spread over the layout's F x R x S data-parallel ranks,
    one microbatch per sequence under pp."""
    t = run.spec.train
    if layout == run.spec.layout:
        return t.batch_per_rank, run.spec.microbatches
    batch = run.spec.layout.dp_world * t.batch_per_rank / layout.dp_world
    return batch, max(layout.P, round(batch)) if layout.P > 1 else 1


def step_of(predictor: Predictor, run: Run, layout: Layout, placement) -> StepTime:
    """The step time of `run`'s model and global batch (spread) in `layout`, placed as `placement`."""
    t = run.spec.train
    batch, micro = spread(run, layout)
    work = Workload(run.spec.model.llama_kwargs, batch, t.seq_len, t.precision, micro, t.sequence_parallel,
                    t.pp_schedule, t.prefetch)
    return predictor.step(layout, work, comm_model(run), placement)


def first_step(predictor: Predictor, run: Run, step: StepTime) -> float | None:
    """The run's first step: its steady step and what its communicators' first calls add (Predictor.first_step_extra);
    None where the probe did not time the run's own groups."""
    extra = predictor.first_step_extra(run.spec.config or run.run_id)
    return None if extra is None else step.step_s + extra


def model_sent_bytes(run: Run) -> dict[str, dict[str, float]]:
    """{per: {group: bytes}} the step-time model has each rank of `run` send per step and per aggregation."""
    spec, t = run.spec, run.spec.train
    acts = Activations.of(spec.model.llama_kwargs, t.batch_per_rank, t.seq_len, spec.microbatches, t.sequence_parallel)
    moved = steptime.transfers(spec.layout, Shapes.of(spec.model.llama_kwargs), comm_model(run), acts)
    return steptime.wire_bytes(moved, steptime.group_ranks(spec.layout))


def memory_of(run: Run, layout: Layout | None = None) -> memory.Memory:
    """Bytes per device of `run`, or of its model and global batch (spread) in `layout`."""
    work = memory.work_of(run.spec)
    if layout is not None:
        batch, micro = spread(run, layout)
        work = replace(work, layout=layout, batch=batch, microbatches=micro,
                       outer_copy=work.outer_copy and layout.federated)
    return memory.per_device(run.spec.model.llama_kwargs, work)


def parallel_choices(run: Run, G: int) -> list[tuple[int, int]]:
    """(pp, tp) pairs the ranking tries: tp a power of two dividing G and the heads, pp a power of two up to
    the layers and 8 stages."""
    kwargs = run.spec.model.llama_kwargs
    heads, layers = kwargs["num_attention_heads"], kwargs["num_hidden_layers"]
    kv = kwargs.get("num_key_value_heads") or heads
    tps = [t for t in (1, 2, 4, 8) if G % t == 0 and heads % t == 0 and kv % t == 0]
    return [(p, t) for p in (1, 2, 4, 8) if p <= layers for t in tps]


def baseline_key(run: Run) -> tuple:
    """What a run is compared with FSDP at: its node count and, in a multirun, its point (model=mini is compared
    with FSDP on mini, not on the first point's model)."""
    return run.nodes, tuple(sorted(run.spec.axes.items()))


def fsdp_baselines(settings: Settings, runs: list[Run], topo: topology.Topology, usable: list[str],
                   predictor: Predictor) -> dict[tuple, tuple[float, StepTime]]:
    """FSDP's predicted communication seconds and step time at each node count (and multirun point) of the sweep:
    what ratios divide by."""
    G = settings.cluster.gpus_per_node
    first = {baseline_key(run): run for run in reversed(runs)}  # the first run of each key gives the model
    out = {}
    for key, run in first.items():
        n = run.nodes
        layout = Layout("fsdp", 1, 1, n * G)
        placement, comm = planner.price(layout, G, comm_model(run), topo, usable)
        out[key] = comm, step_of(predictor, run, layout, placement)
    return out


def entry(settings: Settings, planned: PlannedRun, fsdp: tuple[float, StepTime], manifest: dict,
          predictor: Predictor) -> PlanEntry:
    """`fsdp`: FSDP's predicted communication and step on this run's node count (fsdp_baselines)."""
    run, placement = planned.run, planned.placement
    spec, cluster = run.spec, settings.cluster
    L, model = spec.layout, comm_model(run)
    predicted = predict(spec.layout, model, placement.bandwidth)["predicted_comm_s"]
    step = step_of(predictor, run, spec.layout, placement)
    fsdp_s, fsdp_step = fsdp
    attempt = manifest.get(run.run_id, {}).get("attempts", 0) + 1
    folder = attempt_folder(settings.sweep_dir / run.run_id, attempt)
    scheduler = schedulers.of(cluster)
    script = scheduler.script(planned, folder)
    return PlanEntry(
        run_id=run.run_id, layout=L,
        world_size=spec.world_size, gpus_per_node=cluster.gpus_per_node, model=spec.model.to_dict(),
        model_params=model.params,
        train={k: getattr(spec.train, k) for k in ("steps", "seq_len", "batch_per_rank", "lr", "precision")},
        note=run.note, nodes=placement.nodes, hostfile=placement.hosts, coords=[list(c) for c in placement.coords],
        bandwidth=placement.bandwidth, group_levels=placement.group_levels, hierarchy_ok=placement.hierarchy_ok,
        predicted_comm_s=predicted, predicted_ratio_to_fsdp=predicted / fsdp_s if fsdp_s else None,
        predicted_step_s=step.step_s, predicted_first_step_s=first_step(predictor, run, step),
        predicted_step_bounds_s=[step.full_overlap_s, step.no_overlap_s],
        predicted_compute_s=step.compute_s, predicted_comm_by_group_s=step.comm_s,
        predicted_exposed_comm_s={**step.exposed_s, "by_level": step.exposed_by_level_s},
        predicted_tokens_per_s=spec.world_size * spec.train.batch_per_rank * spec.train.seq_len / step.step_s
        if step.step_s else 0.0,
        predicted_speedup_over_fsdp=fsdp_step.step_s / step.step_s if step.step_s else None,
        compute_source=step.compute_source,
        checkpoint_bytes=checkpoint_bytes(model.params, spec.layout.F, spec.train.precision,
                                          spec.train.average_optimizer_state),
        memory_per_device=memory_of(run).to_dict(),
        memory={"model_bytes": int(memory_of(run).total), "dryrun_peak_bytes": None,
                "dryrun_after_training_bytes": None, "reserve_bytes": int((cluster.memory_reserve_GB or 0) * GB),
                "device_bytes": int(cluster.gpu_memory_GB * GB) if cluster.gpu_memory_GB else None},
        resources=redacted(scheduler.resources(planned)),
        sbatch=None if script is None else "\n".join(map(redact, script.split("\n"))),
    )


def available_host_bytes() -> int | None:
    """This machine's MemAvailable (/proc/meminfo): what processes may take without swapping others out."""
    try:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def check_host_memory(settings: Settings, runs: list[Run]) -> None:
    """cluster=local runs every rank on this machine, so host memory is its device: the model's bytes per rank
    times the ranks must fit in what is available now, or the OOM killer picks among everyone's processes.
    action=dryrun runs nothing real (fake tensors), so it may play any model."""
    if not schedulers.of(settings.cluster).runs_here or settings.action == "dryrun":
        return
    available = available_host_bytes()
    if available is None:
        return
    for run in runs:
        per_rank = memory_of(run).total
        if per_rank * run.spec.world_size > available:
            raise ConfigError(f"{run.run_id} needs {human_bytes(per_rank)} per rank x {run.spec.world_size} ranks = "
                              f"{human_bytes(per_rank * run.spec.world_size)} on this machine, which has "
                              f"{human_bytes(available)} available (MemAvailable): choose a smaller model "
                              f"(model=tiny), fewer ranks (cluster.nodes, cluster.gpus_per_node) or a GPU cluster")


def check_float8(settings: Settings, runs: list[Run]) -> None:
    """Refuse, before anything is submitted, float8 training where the cluster's devices have no fp8 (the job
    itself refuses it on a GPU without, train.parallel.float8)."""
    cluster = settings.cluster
    wanted = [run.run_id for run in runs if run.spec.train.float8]
    if not wanted:
        return
    if cluster.device != "cuda":
        raise ConfigError(f"{wanted[0]}: train.float8=true needs GPUs with fp8 tensor cores (H100, H200, B200), but "
                          f"cluster {cluster.name} runs on {cluster.device}")
    if cluster.fp8 is False:
        raise ConfigError(f"{wanted[0]}: train.float8=true needs GPUs with fp8 tensor cores (H100, H200, B200), but "
                          f"cluster {cluster.name}'s have none (cluster.fp8=false)")


def check_memory(settings: Settings, runs: list[Run]) -> None:
    """Refuse, before anything is submitted, a run whose devices cannot hold it (cluster.gpu_memory_GB), or
    whose ranks together do not fit in this machine's memory (cluster=local)."""
    check_host_memory(settings, runs)
    capacity = settings.cluster.gpu_memory_GB
    if not capacity:
        return
    for run in runs:
        need = memory_of(run)
        if need.total > capacity * GB:
            parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in need.to_dict().items() if k != "total")
            raise ConfigError(f"{run.run_id} needs {human_bytes(need.total)} per device ({parts}) but a device has "
                              f"{capacity:g} GB (cluster.gpu_memory_GB): shard more (S), split the model "
                              f"(train.tp, train.pp) or set train.activation_checkpointing=full")


@dataclass
class Plan:
    """What action=plan computes before anything is written or printed: every run placed and priced, and the
    ranking of every layout on the widest run's nodes."""

    topology: topology.Topology
    source: str              # where the topology came from
    network: str             # where the step-time model's latency and bandwidth came from
    nodes: dict              # how many nodes are free, which were excluded and why (usable_nodes)
    planned: list[PlannedRun]
    entries: list[PlanEntry]
    widest: Run
    ranking: list[dict]

    @property
    def compute_sources(self) -> str:
        """Where the predicted compute came from, each source once, in run order."""
        return "; ".join(dict.fromkeys(e.compute_source for e in self.entries))


@gc_paused()
def make_plan(settings: Settings, runs: list[Run], manifest: dict) -> Plan:
    """Check, place and price every run of the sweep, and rank every layout on the widest run's nodes; writes
    nothing. `manifest`: the sweep's manifest entries (each run's next attempt names its sbatch script's
    folder)."""
    if settings.retry_shrink:
        shrink.check(runs)
    check_float8(settings, runs)
    fault_tolerance.check(settings, runs)
    check_memory(settings, runs)
    topo, source, usable, planned, nodes = place_runs(settings, runs)
    predictor = Predictor(settings, topo)
    fsdp = fsdp_baselines(settings, runs, topo, usable, predictor)
    entries = [entry(settings, p, fsdp[baseline_key(p.run)], manifest, predictor) for p in planned]
    widest = max(runs, key=lambda r: r.nodes)
    G, capacity = settings.cluster.gpus_per_node, settings.cluster.gpu_memory_GB
    ranking = planner.rank_layouts(planner.candidates(widest.nodes, G, parallel=parallel_choices(widest, G)), G,
                                   comm_model(widest), topo, usable,
                                   step=lambda layout, placement: step_of(predictor, widest, layout, placement).step_s,
                                   memory=lambda layout: memory_of(widest, layout).total,
                                   capacity=capacity * GB if capacity else None)
    return Plan(topo, source, predictor.network.source, nodes, planned, entries, widest, ranking)
