"""action=probe: time all_gather, reduce_scatter, all_reduce and broadcast across every topology level, on the
nodes and in the rank layout of the sweep's widest run, with the backend training uses, and fit latency and
bandwidth per (level, collective): <sweep dir>/probe.json, probe.png and a printed table. The same job then
calibrates compute (train.measure.calibrate) for every (model, batch, precision) the sweep runs, and times the stage
step of every tensor- or pipeline-parallel layout it runs in place (train.measure.calibrate_layout): the step-time model
(placement.steptime) reads them back, for this sweep or, with cluster.probe=FILE, for another. Beside the levels'
groups it times the sweep's runs' own communicators (their full size, every group at once) at their own FSDP units'
sizes and each level's ranks in pairs (`scale`), keeps every point's distribution, and measures the host's cost of
a collective and of a 0-layer step with each layout's collectives on (`host`); docs/placement.md lists the fields.

The job is submitted like a run (submitit, local or SLURM); its task 0 prints a line per (level, collective)
done, which the launcher echoes while it waits.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from launcher import scheduler as schedulers
from launcher.actions.outcome import failure_reason
from launcher.placement import topology
from launcher.placement.alphabeta import COLLECTIVES, bus_factor, expected_max, fit
from launcher.placement.levels import level_groups, level_name, traffic
from launcher.placement.memory import human_bytes
from launcher.placement.steptime import Shapes, gathers
from launcher.planning import comm_model, widest_run
from launcher.prediction import stage_layers, stage_seconds
from launcher.settings import Settings
from launcher.submit import task_lines
from train.contract.common import ConfigError, SubmitError, write_atomic
from train.contract.config import TrainConfig
from train.contract.layout import seats
from train.contract.machine import label
from train.contract.spec import FEDAVG_CHUNK_BYTES

GB = 1e9


def sizes(max_bytes: int) -> list[int]:
    """1 KiB, 4 KiB, ... up to max_bytes: a factor 4 apart, as nccl-tests' -f 4."""
    out, size = [], 1 << 10
    while size <= max_bytes:
        out.append(size)
        size *= 4
    return out


def workload(run) -> dict:
    """What a run's compute depends on: its model's shapes, tokens per rank and precision."""
    t = run.spec.train
    return {"model": run.spec.model.llama_kwargs, "batch_per_rank": t.batch_per_rank, "seq_len": t.seq_len,
            "precision": t.precision}


def layout(run) -> dict:
    """What a run's step of compute depends on, measured in place (train.measure.calibrate_layout), pp = tp = 1
    included: its workload at the batch of one data-parallel rank, its degrees, microbatches and schedule, and how
    its layers run where that is not the default (activation checkpointing, torch.compile: a probe.json from before
    they existed still names its layouts)."""
    t = run.spec.train
    kernels = {k: v for k, v in (("activation_checkpointing", t.activation_checkpointing), ("compile", t.compile))
               if v != TrainConfig.__dataclass_fields__[k].default}
    L = run.spec.layout
    return {**workload(run), "pp": L.P, "tp": L.T, "microbatches": run.spec.microbatches, "pp_schedule": t.pp_schedule,
            "sequence_parallel": t.sequence_parallel, **kernels}


def distinct(items) -> list[dict]:
    out = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def workloads(runs) -> list[dict]:
    return distinct(workload(run) for run in runs)


def layouts(runs) -> list[dict]:
    return distinct(layout(run) for run in runs)


def unit_bytes(run) -> dict[tuple[str, str], list[float]]:
    """{(group kind, collective): [bytes, ...]}: the buffers one step (and one FedAvg) of the run sends over each of
    its groups, one per distinct FSDP unit (launcher.placement.steptime: Shapes, gathers) in the run's precision
    (launcher.planning.comm_model): the shard group's all_gather and reduce_scatter of each unit, HSDP's all_reduce
    of each unit's gradient shard, FedAvg's all_reduce of a chunk of the rank's shard (1/R of it per replica) and, in
    FL+HSDP, the replicas' all_gather of the chunk."""
    L, model = run.spec.layout, comm_model(run)
    units = [p for p, _ in gathers(Shapes.of(run.spec.model.llama_kwargs), L.P, L.T)]
    gather_b = model.bytes_per_param
    grad_b = model.grad_bytes_per_param or gather_b
    out: dict[tuple[str, str], list[float]] = {}
    if L.S > 1:
        out[("shard", "all_gather")] = [u * gather_b for u in sorted(set(units))]
        out[("shard", "reduce_scatter")] = [u * grad_b for u in sorted(set(units))]
    if L.R > 1:
        out[("replicate", "all_reduce")] = [u / L.S * grad_b for u in sorted(set(units))]
    if L.F > 1:
        shard = sum(units) / L.S * (model.fedavg_bytes_per_param or gather_b)
        chunks = max(1, -(-int(shard) // FEDAVG_CHUNK_BYTES))
        out[("federation", "all_reduce")] = [shard / chunks / L.R]
        if L.R > 1:
            out[("replicate", "all_gather")] = [shard / chunks]
    return out


AXIS = {"federation": 0, "replicate": 1, "shard": 2}  # a group kind's coordinate in (f, r, s, p, t)


def run_groups(planned: list, max_bytes: int) -> list[dict]:
    """The sweep's runs' data-parallel communicators, for measure_groups: [{collective, seats (each group in the
    run's rank order, all of a kind at once, as the run has them, every rank by its seat: host and place there,
    train.contract.layout.seats), sizes (unit_bytes, at most max_bytes, and 1 KiB so every row spans two sizes),
    kinds, runs (configurations)}], one per distinct (collective, seats). The probe's job times each on the ranks
    holding those seats where its ranks really started (train.job.probe.on_ranks_here)."""
    specs: dict[tuple, dict] = {}
    for p in planned:
        where = seats(p.placement.hosts)
        for (kind, collective), sizes in unit_bytes(p.run).items():
            axis, by_rest = AXIS[kind], {}
            for seat, c in zip(where, p.placement.coords):
                by_rest.setdefault(tuple(c[:axis]) + tuple(c[axis + 1:]), []).append((c[axis], seat))
            groups = [[seat for _, seat in sorted(g)] for g in by_rest.values()]
            spec = specs.setdefault((collective, tuple(map(tuple, groups))),
                                    {"collective": collective, "seats": groups, "sizes": {1024}, "kinds": [],
                                     "runs": []})
            spec["sizes"] |= {int(min(b, max_bytes)) for b in sizes}
            spec["kinds"] += [kind] * (kind not in spec["kinds"])
            name = p.run.spec.config or p.run.run_id  # repeats share their groups
            spec["runs"] += [name] * (name not in spec["runs"])
    return [{**spec, "sizes": sorted(spec["sizes"])} for spec in specs.values()]


def zero_layer(runs) -> list[dict]:
    """What host_cost.zero_layer_steps measures: each run's workload and data-parallel layout (pp = tp = 1 only)."""
    return distinct({**workload(run), "strategy": run.spec.layout.strategy, "F": run.spec.layout.F,
                     "R": run.spec.layout.R, "S": run.spec.layout.S}
                    for run in runs if run.spec.layout.P * run.spec.layout.T == 1)


def slowest_of(spread: list[dict], ns) -> dict[str, list[float]]:
    """{str(n): per point, the expected slowest of n ranks' seconds (alphabeta.expected_max of its quantiles_s)}."""
    return {str(n): [expected_max(d["quantiles_s"], n) for d in spread] for n in sorted(set(ns))}


def _scale_row(row: dict, hosts: list[str], tree, levels: dict) -> dict:
    """A measure_groups row placed: the level it crosses (its groups' busiest), the flows on that level's busiest
    link, its own alpha-beta fit where its sizes allow one, and each point against the level's 2-rank fit priced
    at this row's ranks and flows (`vs_level`: measured / priced, the efficiency the level fit misses)."""
    load = traffic([[hosts[r] for r in g] for g in row["groups"]], tree)
    top = max(load) if load else -1
    out = {**row, "level": row.get("level", level_name(top)), "flows": load.get(top, 1),
           "slowest_of_s": slowest_of(row["dist"], [row["ranks"]])}
    try:
        f = fit([tuple(p) for p in row["points"]])
        out |= {"alpha_s": f.alpha_s, "bytes_per_s": f.bytes_per_s,
                "bus_bytes_per_s": f.bytes_per_s * bus_factor(row["collective"], row["ranks"])}
    except ValueError:  # one size, or noise above the transfer: the points stand alone
        out |= {"alpha_s": None, "bytes_per_s": None, "bus_bytes_per_s": None}
    base = levels.get((out["level"], row["collective"]))
    factor = bus_factor(row["collective"], row["ranks"]) * out["flows"]
    out["vs_level"] = None if base is None else [t / (base["alpha_s"] + b * factor / base["link_bytes_per_s"])
                                                 for b, t in row["points"]]
    return out


def summarise(raw: dict, topo: dict) -> dict:
    """probe.json: each (level, collective) with its alpha-beta fit, bus bandwidth, how many of its groups
    shared the level's busiest link (flows) and so the link's own rate (busbw x flows: what one group alone
    would get) beside the points, and the expected slowest of each group size the runs have there; the runs'
    own groups placed and compared with the level's fit (_scale_row); the host's costs and the compute
    calibration as measured; the machine rank 0 ran on (train.contract.machine; null in a raw file written before
    it was recorded). A raw file from before issue 54 (no `scale`) gives the probe.json of that time."""
    groups = level_groups(raw["hosts"], topo["parent"], topo["level"])
    tree = topology.from_json(topo)
    flows = {name: max(traffic([[raw["hosts"][r] for r in g] for g in groups[name]], tree).values())
             for name in groups}
    levels = []
    for row in raw["levels"]:
        try:
            f = fit([tuple(p) for p in row["points"]])
        except ValueError as exc:  # every size latency-bound (or noise larger than the transfer)
            raise ConfigError(f"probe: {row['level']} {row['collective']}: {exc}; raise probe.max_bytes (now up "
                              f"to {row['points'][-1][0]} bytes) so transfers outlast the latency") from None
        levels.append({**row, "alpha_s": f.alpha_s, "bytes_per_s": f.bytes_per_s,
                       "bus_bytes_per_s": f.bytes_per_s * bus_factor(row["collective"], row["ranks"]),
                       "flows": flows[row["level"]]})
        levels[-1]["link_bytes_per_s"] = levels[-1]["bus_bytes_per_s"] * levels[-1]["flows"]
    by_level = {(e["level"], e["collective"]): e for e in levels}
    scale = [_scale_row(row, raw["hosts"], tree, by_level) for row in raw.get("scale", [])]
    for e in levels:
        if "dist" in e:  # the slowest of 2 and of every size of group the runs have at this level
            e["slowest_of_s"] = slowest_of(e["dist"], [e["ranks"]] + [r["ranks"] for r in scale
                                                                      if r["level"] == e["level"]])
    new = {"scale": scale, "host": raw["host"], "budget_s": raw["budget_s"]} if "scale" in raw else {}
    return {"backend": raw["backend"], "hosts": raw["hosts"], "levels": levels, "barrier_s": raw["barrier_s"],
            "compute": raw["compute"], "layouts": raw["layouts"], **new, "machine": raw.get("machine")}


def table(probe: dict) -> str:
    lines = [f"{'level':<8} {'collective':<15} {'ranks':>5} {'alpha (us)':>11} {'algbw (GB/s)':>13} "
             f"{'busbw (GB/s)':>13} {'flows':>5} {'link (GB/s)':>12}"]
    for e in probe["levels"]:
        lines.append(f"{e['level']:<8} {e['collective']:<15} {e['ranks']:>5} {e['alpha_s'] * 1e6:>11.1f} "
                     f"{e['bytes_per_s'] / GB:>13.4g} {e['bus_bytes_per_s'] / GB:>13.4g} {e['flows']:>5} "
                     f"{e['link_bytes_per_s'] / GB:>12.4g}")
    for e in probe.get("scale", []):
        shown = ", ".join(human_bytes(b) + f" {t * 1e3:.3g} ms" + (f" ({v:.2f}x the level's fit)" if v else "")
                          for (b, t), v in zip(e["points"], e["vs_level"] or [None] * len(e["points"])))
        lines.append(f"{e['level']:<8} {e['collective']:<15} {e['ranks']:>5} ranks x {len(e['groups'])} groups "
                     f"({', '.join(e['kinds'])}{': ' + ', '.join(e['runs'][:3]) if e['runs'] else ''}"
                     f"{' ...' if len(e['runs']) > 3 else ''}): {shown}")
    lines.append(f"machine (rank 0): {label(probe.get('machine'))}")
    lines.append(f"barrier over all {len(probe['hosts'])} ranks: {probe['barrier_s'] * 1e6:.1f} us (a federated run "
                 f"pays one per FedAvg, for its non-finite check)")
    host = probe.get("host")
    if host:
        lines.append("host cost of one call (one-rank group, 1 element): " + ", ".join(
            f"{c} {v['median_s'] * 1e6:.1f} us" for c, v in host["collective_s"].items()))
        for z in host["zero_layer_steps"]:
            lines.append(f"0-layer step of {z['strategy']} ({z['F']},{z['R']},{z['S']}), {z['batch_per_rank']}x"
                         f"{z['seq_len']} tokens: {z['on']['step_s'] * 1e3:.2f} ms with its collectives, "
                         f"{z['off']['step_s'] * 1e3:.2f} ms without ({z['rounds']} rounds)")
    for w in probe["compute"]:
        per = {k: w["root"][k] + w["model"]["num_hidden_layers"] * w["layer"][k] for k in w["root"]}
        lines.append(f"compute {w['model']['num_hidden_layers']} layers x {w['model']['hidden_size']}, "
                     f"{w['batch_per_rank']}x{w['seq_len']} tokens, {w['precision']}: forward "
                     f"{per['forward_s'] * 1e3:.1f} ms, backward {per['backward_s'] * 1e3:.1f} ms, "
                     f"optimizer (whole model) {per['optimizer_s'] * 1e3:.1f} ms per rank"
                     + (f"; repeatability: forward+backward within ±{w['spread']['forward_backward']:.1%} over "
                        + (f"{w['rounds']} rounds of {len(w['depths'])} depths" if "rounds" in w else
                           f"{len(w['repeats'])} repeats") + " (medians shown)" if "spread" in w else "")
                     + ("" if w.get("resolved", {}).get("forward_backward", True) else
                        "; a layer's forward+backward not resolved (its 95 % interval includes 0)"))
    for w in probe.get("layouts", []):
        n = stage_layers(w, w["model"]["num_hidden_layers"])
        per = stage_seconds(w, w["model"]["num_hidden_layers"])
        fb = per["forward_s"] + per["backward_s"]
        lines.append(f"compute of layout pp={w['pp']} tp={w['tp']} ({w['microbatches']} microbatches, "
                     f"{w['pp_schedule'] if w['pp'] > 1 else 'no schedule'}"
                     f"{', sequence-parallel' if w['sequence_parallel'] else ''}), {w['batch_per_rank']}x"
                     f"{w['seq_len']} tokens per pipeline, {w['precision']}: forward+backward {fb * 1e3:.1f} ms per "
                     f"stage of {n} layers, in place (tensor and pipeline traffic and bubble included); within "
                     f"±{w['spread']['forward_backward']:.1%} over "
                     + (f"{w['rounds']} rounds" if "rounds" in w else f"{len(w['repeats'])} repeats"))
    return "\n".join(lines)


def plot(probe: dict, path: Path) -> Path:
    """Bus bandwidth against message size, one line per (level, collective)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from launcher.report.plots import line_style, save_png

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, e in enumerate(probe["levels"]):
        factor = bus_factor(e["collective"], e["ranks"])
        ax.plot([b for b, _ in e["points"]], [b / t * factor / GB for b, t in e["points"]],
                label=f"{e['level']} {e['collective']} ({e['ranks']} ranks)", **line_style(i))
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
           title=f"Probe ({probe['backend']}): bus bandwidth per level")
    ax.legend(fontsize=6)
    return save_png(fig, path)


@dataclass(frozen=True)
class ProbeRanks:
    """Where the probe's ranks run: the planned hosts (cluster=local's virtual nodes) and the topology, the device
    and backend training uses, and how long a rank waits for the others."""
    hosts: list[str]
    topology: dict
    device: str
    backend: str
    timeout_s: float


@dataclass(frozen=True)
class ProbeWork:
    """What the probe measures: collectives of `sizes` bytes per level, each point the median of at least `iters`
    calls, the runs' own communicators (`groups`, run_groups), then the compute of the sweep's `workloads`, the stage
    steps of its `layouts` and the 0-layer steps of its data-parallel layouts (`zero_layer`), each calibration for up
    to `budget_s` seconds."""
    sizes: list[int]
    iters: int
    workloads: list[dict]
    layouts: list[dict]
    budget_s: float = 10.0
    groups: list[dict] = field(default_factory=list)
    zero_layer: list[dict] = field(default_factory=list)


class ProbeJob:
    """The probe as a picklable job, on every rank like a training run (a task per rank under SLURM, ranks forked by
    one task locally). The levels are computed where the ranks really are: under SLURM from every rank's
    SLURMD_NODENAME, else from the planned hosts."""

    PRELOAD = ("train.job.probe",)  # see train.job.TrainJob.PRELOAD

    def __init__(self, ranks: ProbeRanks, work: ProbeWork, out_path: str):
        self.ranks, self.work, self.out_path = ranks, work, out_path

    def __call__(self) -> None:
        from train.job.probe import run  # the job's side: torch only where ranks run

        run(self.ranks, self.work, self.out_path, level_groups, COLLECTIVES)


def probe(settings: Settings, runs: list | None = None) -> Path:
    """Run the probe job, echo its progress, fit, write probe.json and probe.png, print the table. `runs`: the
    sweep's runs when given (a multirun's), else expand(settings); their workloads are calibrated."""
    cluster, scheduler = settings.cluster, schedulers.of(settings.cluster)
    scheduler.check_environment()
    topo, planned, widest = widest_run(settings, runs)
    folder = settings.sweep_dir / "probe"
    raw_path = folder / "raw.json"
    raw_path.unlink(missing_ok=True)
    tree = topology.to_json(topo)
    job = ProbeJob(ProbeRanks(widest.placement.hosts, tree, cluster.device, cluster.backend,
                              widest.run.spec.train.timeout_s),
                   ProbeWork(sizes(settings.probe.max_bytes), settings.probe.iters,
                             workloads([p.run for p in planned]), layouts([p.run for p in planned]),
                             settings.probe.budget_s, run_groups(planned, settings.probe.max_bytes),
                             zero_layer([p.run for p in planned])), str(raw_path))
    submitted = scheduler.submit_job(scheduler.executor(widest, folder / "submitit"), job, "the probe",
                                     folder / "submitit")
    world = widest.run.spec.world_size
    print(f"probe: job {submitted.job_id} on {world} ranks ({len(widest.placement.nodes)} nodes, placed like "
          f"{widest.run.run_id})", flush=True)
    echoed: list[str] = []

    def echo(_state) -> None:  # the probe's progress lines task 0 wrote since the last poll
        lines = task_lines(submitted, "probe: ")
        for line in lines[len(echoed):]:
            print(f"  {line}", flush=True)
        echoed[:] = lines

    scheduler.wait_for(submitted, world, settings.poll_s, echo)
    if not raw_path.exists():
        raise SubmitError(f"the probe job failed: {failure_reason(submitted, world)}")
    result = summarise(json.loads(raw_path.read_text()), tree)
    path = settings.sweep_dir / "probe.json"
    write_atomic(path, json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"probe written to {path} and {plot(result, settings.sweep_dir / 'probe.png')}")
    return path

