"""action=plan: every run's layout, placement, predicted communication (the paper's model) and step time
(compute + every collective, launcher.prediction), and sbatch script -> plan.json."""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from launcher import dryrun, shrink
from launcher import scheduler as schedulers
from launcher.errors import ConfigError
from launcher.placement import allocate, gc_paused, memory, steptime, topology
from launcher.placement import ranking as planner
from launcher.placement.costmodel import Model, checkpoint_bytes, model_from_preset, predict
from launcher.placement.steptime import ModelParallel, Shapes, StepTime
from launcher.prediction import TOLERANCE, Predictor, Workload
from launcher.registry import model_name
from launcher.report.tables import human_bytes, oriented
from launcher.secrets import redact, redacted
from launcher.settings import Settings
from launcher.slurm import hardware
from launcher.slurm.submit import attempt_folder, require_netns
from launcher.store import Store
from launcher.sweep import PlannedRun, Run, expand
from train.common import write_atomic
from train.parallel.strategy import STRATEGIES, Layout

GB = 1e9


@dataclass(frozen=True)
class PlanEntry:
    """One run as plan.json shows it (report/write.py reads it back from there): layout, placement, prediction."""

    run_id: str
    strategy: str
    F: int
    R: int
    S: int
    A: int | None
    tp: int                               # tensor-parallel degree: ranks of one node splitting each matrix
    pp: int                               # pipeline stages
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
    predicted_step_bounds_s: list[float]  # [full overlap, no overlap]
    predicted_compute_s: float | None
    predicted_comm_by_group_s: dict       # shard, replicate, federation (amortised over A)
    predicted_tokens_per_s: float
    predicted_speedup_over_fsdp: float | None
    compute_source: str
    checkpoint_bytes: int
    memory_per_device: dict               # bytes at the peak, by kind (launcher.placement.memory)
    memory: dict                          # model_bytes, dryrun_peak_bytes, dryrun_after_training_bytes (null
                                          # without a dry-run: launcher.dryrun), reserve_bytes, device_bytes
    resources: dict
    sbatch: str | None  # SLURM clusters only

    def to_json(self) -> dict:
        """This run's object in plan.json: the fields, in their order, as keys."""
        return asdict(self)


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


def place_one(cluster, topo: topology.Topology, real: bool, usable: list[str], run: Run) -> PlannedRun:
    """`run` placed on `usable` nodes of `topo` (`real`: SLURM's own topology), with its sbatch topology request."""
    s, G = run.spec, cluster.gpus_per_node
    mp = {"P": s.train.pp, "T": s.train.tp}
    placement = allocate.place(s.F, s.R, s.S, G, topo, usable, **mp)
    slurm_order = cluster.placement == "slurm"
    if slurm_order:
        placement = allocate.in_slurm_order(placement, s.F, s.R, s.S, G, topo, **mp)
    # --switches on SLURM's own tree only, and not when SLURM's order is kept: the paper asked for no switches
    count_leaves = real and not slurm_order  # real: a topology the scheduler itself reads
    leaves = len({topo.parent[n] for n in placement.nodes}) if count_leaves else None
    return PlannedRun(run, placement, leaves, topology_request(cluster, topo, run, leaves))


def topology_request(cluster, topo: topology.Topology, run: Run, leaves: int | None) -> dict:
    """What an in-job run asks SLURM for so that it lands low in the topology: on a tree, --switches=K@wait (K =
    the leaves the plan spans); on blocks, --segment=K (K = one federation group's nodes, the whole job for
    FSDP/HSDP) when a group spans several nodes and fits the smallest block. On blocks, an FL+HSDP group no
    block can hold, or a sbatch_extra.segment that none can, is refused."""
    s = run.spec
    group_nodes, _ = allocate.units(s.F, s.R, s.S * s.train.pp * s.train.tp, cluster.gpus_per_node)
    if topo.block_size:
        row = STRATEGIES[run.spec.strategy]
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
        return t.batch_per_rank, t.n_microbatches
    batch = run.spec.dims.dp_world * t.batch_per_rank / layout.dp_world
    return batch, max(layout.P, round(batch)) if layout.P > 1 else 1


def step_of(predictor: Predictor, run: Run, layout: Layout, placement) -> StepTime:
    """The step time of `run`'s model and global batch (spread) in `layout`, placed as `placement`."""
    t = run.spec.train
    batch, micro = spread(run, layout)
    work = Workload(run.spec.model.llama_kwargs, batch, t.seq_len, t.precision, micro, t.sequence_parallel,
                    t.pp_schedule)
    return predictor.step(layout, work, comm_model(run), placement)


def model_sent_bytes(run: Run) -> dict[str, dict[str, float]]:
    """{per: {group: bytes}} the step-time model has each rank of `run` send per step and per aggregation."""
    spec, t = run.spec, run.spec.train
    mp = ModelParallel.of(spec.model.llama_kwargs, t.batch_per_rank, t.seq_len, t.pp, t.tp, t.n_microbatches,
                          t.sequence_parallel)
    moved = steptime.transfers(spec.F, spec.R, spec.S, Shapes.of(spec.model.llama_kwargs), comm_model(run), mp)
    return steptime.wire_bytes(moved, steptime.group_ranks(spec.F, spec.R, spec.S, mp))


def memory_of(run: Run, layout: Layout | None = None) -> memory.Memory:
    """Bytes per device of `run`, or of its model and global batch (spread) in `layout`."""
    m = memory.layout_of(run.spec)
    if layout is not None:
        batch, micro = spread(run, layout)
        m = replace(m, S=layout.S, P=layout.P, T=layout.T, batch=batch, microbatches=micro,
                    federated=layout.F > 1, outer_copy=m.outer_copy and layout.F > 1)
    return memory.per_device(run.spec.model.llama_kwargs, m)


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


def entry(settings: Settings, planned: PlannedRun, fsdp: tuple[float, StepTime], store: Store,
          predictor: Predictor) -> PlanEntry:
    """`fsdp`: FSDP's predicted communication and step on this run's node count (fsdp_baselines)."""
    run, placement = planned.run, planned.placement
    spec, cluster = run.spec, settings.cluster
    model = comm_model(run)
    predicted = predict(spec.layout, model, placement.bandwidth)["predicted_comm_s"]
    step = step_of(predictor, run, spec.layout, placement)
    fsdp_s, fsdp_step = fsdp
    attempt = store.entries.get(run.run_id, {}).get("attempts", 0) + 1
    folder = attempt_folder(settings.sweep_dir / run.run_id, attempt)
    scheduler = schedulers.of(cluster)
    script = scheduler.script(planned, folder)
    return PlanEntry(
        run_id=run.run_id, strategy=spec.strategy, F=spec.F, R=spec.R, S=spec.S, A=spec.A, tp=spec.train.tp,
        pp=spec.train.pp,
        world_size=spec.world_size, gpus_per_node=cluster.gpus_per_node, model=spec.model.to_dict(),
        model_params=model.params,
        train={k: getattr(spec.train, k) for k in ("steps", "seq_len", "batch_per_rank", "lr", "precision")},
        note=run.note, nodes=placement.nodes, hostfile=placement.hosts, coords=[list(c) for c in placement.coords],
        bandwidth=placement.bandwidth, group_levels=placement.group_levels, hierarchy_ok=placement.hierarchy_ok,
        predicted_comm_s=predicted, predicted_ratio_to_fsdp=predicted / fsdp_s if fsdp_s else None,
        predicted_step_s=step.step_s, predicted_step_bounds_s=[step.full_overlap_s, step.no_overlap_s],
        predicted_compute_s=step.compute_s, predicted_comm_by_group_s=step.comm_s,
        predicted_tokens_per_s=spec.world_size * spec.train.batch_per_rank * spec.train.seq_len / step.step_s
        if step.step_s else 0.0,
        predicted_speedup_over_fsdp=fsdp_step.step_s / step.step_s if step.step_s else None,
        compute_source=step.compute_source,
        checkpoint_bytes=checkpoint_bytes(model.params, spec.F, spec.train.precision,
                                          spec.train.average_optimizer_state),
        memory_per_device=memory_of(run).to_dict(),
        memory={"model_bytes": int(memory_of(run).total), "dryrun_peak_bytes": None,
                "dryrun_after_training_bytes": None, "reserve_bytes": int((cluster.memory_reserve_GB or 0) * GB),
                "device_bytes": int(cluster.gpu_memory_GB * GB) if cluster.gpu_memory_GB else None},
        resources=redacted(scheduler.resources(planned)),
        sbatch=None if script is None else "\n".join(map(redact, script.split("\n"))),
    )


def layout_name(row: dict) -> str:
    """A ranking row's layout as the plan prints it (Layout.label)."""
    return Layout(row["strategy"], row["F"], row["R"], row["S"], row["A"], row["pp"], row["tp"]).label


def ranking_table(ranking: list[dict], nodes: int, G: int, capacity: float | None, header: str) -> str:
    """ranking.md: every layout the plan ranked, fastest first, with its predicted step and memory per device, so
    a reader can see where each layout lands without reading plan.json."""
    lines = [f"# Every layout on {nodes} nodes of {G} GPUs, fastest first", "", header, "",
             "| # | strategy | F | R | S | A | pp | tp | predicted step (s) | faster than FSDP | memory per device |"
             + (" fits |" if capacity else ""),
             "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---|" if capacity else "")]
    for i, row in enumerate(ranking, 1):
        speedup = "-" if row.get("speedup_over_fsdp") is None else f"{row['speedup_over_fsdp']:.3g}×"
        lines.append(f"| {i} | {row['strategy']} | {row['F']} | {row['R']} | {row['S']} | {row['A'] or '-'} | "
                     f"{row['pp']} | {row['tp']} | {row['predicted_step_s']:.4g} | {speedup} | "
                     f"{human_bytes(row['memory_per_device_bytes'])} |"
                     + ((" yes |" if row["fits"] else " **no** |") if capacity else ""))
    return "\n".join(lines) + "\n"


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


def close_to_best(ranking: list[dict]) -> int:
    """How many of the ranked layouts (fastest first) predict a step within TOLERANCE of the fastest: more
    than one means the prediction cannot tell them apart."""
    if not ranking or "predicted_step_s" not in ranking[0]:
        return 0
    best = ranking[0]["predicted_step_s"]
    return sum(row["predicted_step_s"] <= best * (1 + TOLERANCE) for row in ranking)


def _dryrun_bytes(memory: dict) -> str:
    """The dry-run's peak (training or after it), or '-' when none ran."""
    if memory["dryrun_peak_bytes"] is None:
        return "-"
    return human_bytes(max(memory["dryrun_peak_bytes"], memory["dryrun_after_training_bytes"]))


def _gbps(b) -> str:
    return "-" if b is None else f"{b / GB:g}"


@gc_paused()
def plan(settings: Settings, runs: list[Run] | None = None,
         echo: bool = True) -> tuple[list[PlannedRun], list[PlanEntry]]:
    """Place and price every run; write plan.json (action=plan prints it, action=run keeps it for the report
    and submits the placed runs it returns)."""
    runs = expand(settings) if runs is None else runs
    if settings.retry_shrink:
        shrink.check(runs)
    check_float8(settings, runs)
    check_memory(settings, runs)
    store = Store(settings.sweep_dir)  # a malformed manifest stops the plan before anything is written
    out = output_dir(settings, store)
    topo, source, usable, planned, nodes = place_runs(settings, runs)
    predictor = Predictor(settings, topo)
    fsdp = fsdp_baselines(settings, runs, topo, usable, predictor)
    entries = [entry(settings, p, fsdp[baseline_key(p.run)], store, predictor) for p in planned]
    if settings.action == "dryrun" or settings.plan["dryrun"]:
        print(f"dry-run of {len(entries)} run(s) on fake tensors at their real world size (launcher.dryrun):")
        measured = dryrun.dryrun(settings, runs, {e.run_id: e.memory["model_bytes"] for e in entries},
                                 {run.run_id: model_sent_bytes(run) for run in runs}, out)
        entries = [replace(e, memory=measured[e.run_id]) for e in entries]
    widest = max(runs, key=lambda r: r.nodes)
    G, capacity = settings.cluster.gpus_per_node, settings.cluster.gpu_memory_GB
    ranking = planner.rank_layouts(planner.candidates(widest.nodes, G, parallel=parallel_choices(widest, G)), G,
                                   comm_model(widest), topo, usable,
                                   step=lambda layout, placement: step_of(predictor, widest, layout, placement).step_s,
                                   memory=lambda layout: memory_of(widest, layout).total,
                                   capacity=capacity * GB if capacity else None)
    network = predictor.network.source
    write_atomic(out / "topology.json", json.dumps(topology.to_json(topo)) + "\n")
    path = out / "plan.json"
    write_atomic(path, json.dumps({"sweep": settings.sweep.name, "cluster": settings.cluster.name,
                                   "topology": source, "network": network, "nodes": nodes,
                                   "runs": [e.to_json() for e in entries],
                                   "ranking": ranking}, indent=2) + "\n")
    sources = "; ".join(dict.fromkeys(e.compute_source for e in entries))  # each source once, in run order
    scripts = write_scripts(out, entries)
    write_atomic(out / "ranking.md", ranking_table(
        ranking, widest.nodes, G, capacity, f"`action=plan` of sweep {settings.sweep.name} on cluster "
        f"{settings.cluster.name} ({source}): the step-time model with {network}, compute {sources}; memory "
        f"per device from launcher/placement/memory.py" + (f" against {capacity:g} GB" if capacity else "") + "."))
    if not echo:
        return planned, entries
    print(f"sweep {settings.sweep.name} on cluster {settings.cluster.name} ({source}): {len(entries)} run(s)")
    for line in header(settings, runs) + schedulers.of(settings.cluster).job_environment(settings.results_dir):
        print(f"  {line}")
    if nodes["excluded"] or nodes["note"]:
        why = "; ".join(f"{n} {reason} ({', '.join(nodes['examples'][reason])}{', ...' if n > 3 else ''})"
                        for reason, n in nodes["excluded"].items())
        gpus, cpus = node_share(settings.cluster)
        print(f"  nodes: {nodes['free']} with one node's share free ({gpus} GPUs, {cpus} CPUs)"
              + (f"; excluded: {why}" if why else "") + (f"; {nodes['note']}" if nodes["note"] else ""))
    width = max(28, *(len(e.run_id) for e in entries))
    print(f"  {'run':<{width}} {'ranks':>5} {'nodes':>5}  B_S/B_R/B_F GB/s     order  {'paper comm':>10} "
          f"{'less comm than FSDP':>19}  {'compute':>8} {'comm':>8} {'step (s)':>9} {'tokens/s':>9} "
          f"{'faster than FSDP':>16}  checkpoint  memory/device  dry-run")
    for e in entries:
        bw = "/".join(_gbps(e.bandwidth[k]) for k in ("B_S", "B_R", "B_F"))
        ratio = oriented(1 / e.predicted_ratio_to_fsdp, "more") if e.predicted_ratio_to_fsdp else "-"
        speedup = oriented(e.predicted_speedup_over_fsdp, "slower") if e.predicted_speedup_over_fsdp else "-"
        compute = "?" if e.predicted_compute_s is None else f"{e.predicted_compute_s:.3g}s"
        comm = f"{sum(e.predicted_comm_by_group_s.values()):.3g}s"
        print(f"  {e.run_id:<{width}} {e.world_size:>5} {len(e.nodes):>5}  {bw:<20} "
              f"{'ok' if e.hierarchy_ok else 'BROKEN':<6} {e.predicted_comm_s:>9.3g}s  {ratio:>19}  "
              f"{compute:>8} {comm:>8} {e.predicted_step_s:>9.3g} {e.predicted_tokens_per_s:>9,.0f} {speedup:>16}  "
              f"{human_bytes(e.checkpoint_bytes):>9}  {human_bytes(e.memory_per_device['total']):>12}  "
              f"{_dryrun_bytes(e.memory):>7}"
              + (f"  {e.note}" if e.note else ""))
    print(f"  paper comm and less comm: the paper's formulas at nominal bandwidth; compute, comm, step, tokens/s and "
          f"faster: the step-time model ({'full' if settings.cluster.device == 'cuda' else 'no'} compute/communication "
          f"overlap) with {network}, compute {sources}")
    print(f"fastest layouts on {widest.nodes} nodes (predicted step time):")
    for row in ranking[:5]:
        comm = (f"comm {oriented(1 / row['ratio_to_fsdp'], 'more', 'less')} than FSDP" if row["ratio_to_fsdp"]
                else "no traffic in the paper's formulas (which price no tensor or pipeline traffic)")
        print(f"  {layout_name(row)}: {row['predicted_step_s']:.3g} s/step, "
              f"{oriented(row['speedup_over_fsdp'], 'slower', 'faster')} than FSDP; {comm}; "
              f"{human_bytes(row['memory_per_device_bytes'])} per device" + ("" if row["fits"] else " (does NOT fit)"))
    close = close_to_best(ranking)
    if close > 1:
        print(f"  no clear winner: the {close} fastest layouts are within ±{TOLERANCE:.0%} of the fastest, the "
              f"step-time model's target tolerance (action=validate measures how it does)")
    if scripts:
        print(f"sbatch scripts: {len(scripts)} in {scripts[0].parent}; the first, {scripts[0].name}:")
        print(scripts[0].read_text().rstrip())
    if out != settings.sweep_dir:
        print(f"this sweep has runs (manifest.jsonl), so its plan.json stays as it is: this plan went to {out}")
    print(f"plan written to {path}")
    return planned, entries


def output_dir(settings: Settings, store: Store) -> Path:
    """Where the plan goes: the sweep's directory, except when action=plan or dryrun looks at a sweep that has runs
    (their report reads its plan.json): a plans/<time>/ directory of its own then, never replacing what ran."""
    if settings.action in ("plan", "dryrun") and store.entries:
        return settings.sweep_dir / "plans" / time.strftime("%Y%m%d-%H%M%S")
    return settings.sweep_dir


def write_scripts(out: Path, entries: list[PlanEntry]) -> list[Path]:
    """Each SLURM run's sbatch script as scripts/<run_id>.sbatch beside plan.json, to read before submitting."""
    paths = []
    for e in entries:
        if e.sbatch is not None:
            paths.append(out / "scripts" / f"{e.run_id}.sbatch")
            write_atomic(paths[-1], e.sbatch + "\n")
    return paths


def header(settings: Settings, runs: list[Run]) -> list[str]:
    """What the sweep trains, before how it is laid out: model, data, steps, global batch, tokens, and that
    training starts from random weights (pretraining, as the paper)."""
    def distinct(values) -> str:
        return " / ".join(dict.fromkeys(values))

    specs = [run.spec for run in runs]
    models = distinct(f"{model_name(run.spec.model.to_dict())} ({comm_model(run).params / 1e9:.3g} B parameters)"
                      for run in runs)
    data = distinct(_data_words(s.data) for s in specs)
    batch = distinct(f"{s.dims.dp_world * s.train.batch_per_rank} sequences x {s.train.seq_len} tokens" for s in specs)
    tokens = distinct(f"{s.train.steps * s.dims.dp_world * s.train.batch_per_rank * s.train.seq_len / 1e6:.4g} M"
                      for s in specs)
    return [f"model: {models}, random initialisation (pretraining, as the paper; no checkpoint is loaded)",
            f"data: {data}",
            f"steps: {distinct(str(s.train.steps) for s in specs)}; global batch: {batch}; tokens per run: {tokens}"]


def _data_words(data) -> str:
    if data.kind == "synthetic":
        return (f"synthetic Markov chain (data=synthetic, branching {data.branching}; "
                f"data=tokens data.path=DIR trains on a corpus)")
    if data.kind == "tokens":
        return f"prepared tokens in {data.path}"
    return f"text files {', '.join(data.paths)} (tokenizer {data.tokenizer})"
