"""The step-time model fed with what is known about this cluster: a probe (cluster.probe, else this sweep's
probe.json) for alpha/beta per level and measured compute, otherwise nominal bandwidth and peak_flops."""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from launcher import scheduler as schedulers
from launcher.placement.allocate import Placement
from launcher.placement.costmodel import LLAMA_KEYS, Model
from launcher.placement.network import Network
from launcher.placement.schedule import NO_WIRE, Cores, Execution
from launcher.placement.steptime import (
    Activations,
    Compute,
    Links,
    Shapes,
    StepTime,
    group_ranks,
    load,
    step_time,
    transfers,
)
from launcher.placement.topology import Topology
from launcher.settings import Settings
from train.contract.common import ConfigError
from train.contract.layout import Layout

TOLERANCE = 0.20  # the step-time model's target: every validated prediction within ±20 % of the measured step


def probe_file(settings: Settings) -> Path | None:
    """cluster.probe if set (it must exist), else the sweep's own probe.json when action=probe wrote one."""
    if settings.cluster.probe is not None:
        path = Path(settings.cluster.probe).expanduser()
        if not path.is_file():
            raise ConfigError(f"cluster.probe={settings.cluster.probe}: no such file (write one with action=probe)")
        return path
    own = settings.sweep_dir / "probe.json"
    return own if own.is_file() else None


def read_probe(path: Path) -> dict:
    try:
        probe = json.loads(path.read_text())
        for e in probe["levels"]:
            _ = e["level"], e["collective"], float(e["alpha_s"]), float(e["link_bytes_per_s"]), int(e["flows"])
        for w in probe["compute"]:
            _ = w["model"], w["root"]["forward_s"], w["layer"]["optimizer_s"]
        for w in probe.get("layouts", []):  # absent from probes written before layouts were measured in place
            _ = w["model"], w["pp"], w["tp"], w["one"]["forward_s"], w["layer"]["optimizer_s"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a probe.json written by action=probe ({type(exc).__name__}: {exc})") from None
    return probe


def between_averages(layout: Layout, compute: Compute | None, cores: Cores | None) -> Compute | None:
    """A federated layout's compute between its averages where its ranks share cores. The probe steps every rank at
    once, each step started at a barrier, and keeps the slowest rank's seconds: FSDP, HSDP and a layout averaging
    every step wait for that rank in each step. Between averages a federation group waits for no other group, so
    the cores a waiting rank leaves go to another group's ranks and no core idles: the step takes the ranks' CPU
    seconds over the cores they share (the mean rank's, times ranks per core as the probe ran), when that is the
    shorter. Issue 54: FL+FSDP (4,1,1) tp 2 A 8 on the testbed, priced at the slowest of its 8 ranks on 2 cores
    (0.25 s), ran 0.174 s a step; its stage's CPU seconds over the cores came to 0.167 s."""
    if (compute is None or compute.cpu_s is None or cores is None or layout.F == 1 or (layout.A or 1) == 1):
        return compute
    shared = compute.cpu_s * cores.measured_stretch
    whole = compute.forward_s + compute.backward_s + compute.optimizer_s
    if shared >= whole:
        return compute
    f = shared / whole
    return replace(compute, forward_s=compute.forward_s * f, backward_s=compute.backward_s * f,
                   optimizer_s=compute.optimizer_s * f,
                   root_s=compute.root_s and (compute.root_s[0] * f, compute.root_s[1] * f),
                   source=compute.source + ", its CPU seconds over the shared cores between averages")


def stage_layers(measured: dict, layers: int) -> int:
    """Layers in the largest pipeline stage of a probe's in-place layout measurement: ceil(layers / pp)."""
    return -(-layers // measured["pp"])


def stage_seconds(measured: dict, layers: int) -> dict:
    """Phase seconds of a stage of stage_layers layers from a probe's in-place layout measurement
    (train.measure.calibrate_layout): the 1-layer stage step plus each further layer."""
    n = stage_layers(measured, layers)
    return {k: measured["one"][k] + (n - 1) * measured["layer"][k] for k in measured["one"]}


class Predictor:
    """Prices layouts placed on `topo`; says where its numbers come from (network.source, Compute.source)."""

    def __init__(self, settings: Settings, topo: Topology):
        self.cluster, self.topo = settings.cluster, topo
        path = probe_file(settings)
        self.probe = read_probe(path) if path else None
        self.network = (Network.from_probe(self.probe, f"probe {path}") if self.probe
                        else Network.nominal(topo.bandwidth))


    def compute(self, layout: Layout, work: Workload) -> Compute | None:
        """The layout's step of compute as the probe measured it in place (every rank at once, a stage of 1 and
        of 2 layers), when it did for exactly this layout, pp = tp = 1 included; else the model's compute
        measured by the probe for this (model, seq_len, precision), at this batch or scaled in proportion from
        the probe's (a tensor- or pipeline-parallel layout keeps the global batch on fewer data-parallel ranks, so
        each has more), else estimated from peak_flops, else None. The second serves the layouts a plan ranks
        beyond its runs, and probes written before pp = tp = 1 was measured in place."""
        measured = self.stage_compute(layout, work)
        if measured is not None:
            return measured
        kwargs = work.llama_kwargs
        wanted = ({k: kwargs[k] for k in LLAMA_KEYS}, work.seq_len, work.precision)
        for w in (self.probe or {}).get("compute", []):
            have = ({k: w["model"].get(k) for k in LLAMA_KEYS}, w["seq_len"], w["precision"])
            if have == wanted:
                L = kwargs["num_hidden_layers"]
                scale = work.batch / w["batch_per_rank"]
                per = {k: (w["root"][k] + L * w["layer"][k]) * (scale if k != "optimizer_s" else 1) for k in w["root"]}
                source = "measured by the probe" + (f", scaled from batch {w['batch_per_rank']}" if scale != 1 else "")
                root = (w["root"]["forward_s"] * scale, w["root"]["backward_s"] * scale)
                return Compute(per["forward_s"], per["backward_s"], per["optimizer_s"], source, root_s=root)
        if self.cluster.peak_flops:
            return Compute.estimated(kwargs, work.batch, work.seq_len, self.cluster.peak_flops)
        return None

    def stage_compute(self, layout: Layout, work: Workload) -> Compute | None:
        """The probe's in-place measurement of this layout (launcher.actions.probe.layout: the same model shapes,
        batch per data-parallel rank, degrees, microbatches, schedule and sequence parallelism), priced at
        ceil(L / pp) layers per stage; None when the probe has none."""
        kwargs = work.llama_kwargs
        wanted = ({k: kwargs[k] for k in LLAMA_KEYS}, work.batch, work.seq_len, work.precision, layout.P, layout.T,
                  work.microbatches, work.schedule if layout.P > 1 else None, work.sequence_parallel)
        for w in (self.probe or {}).get("layouts", []):
            have = ({k: w["model"].get(k) for k in LLAMA_KEYS}, w["batch_per_rank"], w["seq_len"], w["precision"],
                    w["pp"], w["tp"], w["microbatches"], w["pp_schedule"] if w["pp"] > 1 else None,
                    w["sequence_parallel"])
            if have == wanted:
                per = stage_seconds(w, kwargs["num_hidden_layers"])
                root = tuple(max(0.0, w["one"][k] - w["layer"][k]) for k in ("forward_s", "backward_s"))
                cpu = w.get("cpu")  # absent from probes written before the ranks' CPU seconds were kept
                cpu_s = cpu["one"] + (stage_layers(w, kwargs["num_hidden_layers"]) - 1) * cpu["layer"] if cpu else None
                return Compute(per["forward_s"], per["backward_s"], per["optimizer_s"],
                               "the layout's stage measured in place by the probe", in_place=True, root_s=root,
                               cpu_s=cpu_s)
        return None

    def cores(self, layout: Layout, compute: Compute | None) -> Cores | None:
        """How a CPU cluster's ranks share cores (launcher.placement.schedule.Cores): where every rank runs on this
        machine (cluster=local; the testbed, whose nodes are network namespaces of it) all the job's ranks share its
        cores (the probe's machine's, when it recorded them), and every byte, over the testbed's emulated wires too,
        is moved by those cores (the kernel's veth, tc and TCP work, 100 % system time while the probe runs): no
        wait frees a core, so compute runs as the probe measured it, all ranks at once (results/testbed/README.md,
        issue 54's development set: freeing the cores while traffic crossed a wire priced FSDP's compute at a third of
        what its runs measured). Elsewhere a node's ranks share cpus_per_task each (None when unset: no sharing is
        priced), and traffic off the node frees its cores."""
        if self.cluster.device != "cpu":
            return None
        here = schedulers.of(self.cluster).runs_here  # cluster=local: every level is this machine's memory
        together = here or bool(self.cluster.netns)
        machine = (self.probe or {}).get("machine") or {}
        if together:
            cores = machine.get("cores_usable") or machine.get("cores") or len(os.sched_getaffinity(0))
            ranks = layout.world
        elif self.cluster.cpus_per_task:
            cores, ranks = self.cluster.cpus_per_task * self.cluster.gpus_per_node, self.cluster.gpus_per_node
        else:
            return None
        measured = self.probe is not None and compute is not None and "measured" in compute.source
        hosts = (self.probe or {}).get("hosts") or []
        probe_ranks = (len(hosts) if together else max(Counter(hosts).values())) if measured and hosts else 1
        return Cores(ranks, cores, probe_ranks, cores if measured else 1, NO_WIRE if together else 0)

    def step(self, layout: Layout, work: Workload, model: Model, placement: Placement) -> StepTime:
        """`layout` placed as `placement`, doing `work`."""
        if placement.loads is None:
            placement.loads = load(placement, layout, self.topo)
        compute = self.compute(layout, work)
        cores = self.cores(layout, compute)
        compute = between_averages(layout, compute, cores)
        shapes = Shapes.of(work.llama_kwargs)
        how = Execution(prefetch=work.prefetch, cores=cores, host_s=self.host(layout, shapes, model, work))
        return step_time(layout, shapes, model, Links(self.network, placement.loads), compute,
                         overlap=self.cluster.device == "cuda", acts=work.activations, how=how)

    def first_step_extra(self, configuration: str) -> float | None:
        """What a run's first step adds to a steady one, from the probe's rows of the run's own groups (`scale`, their
        `runs` naming the configuration): each collective's first call on each communicator over a later call
        (first_call_s - median_s at the smallest size timed: gloo creates its pairs when the group is made, before
        training, and a first call still pays for buffers and the first exchange). FSDP2's lazy initialisation and
        the first allocations are not priced. None where the probe timed none of the run's groups."""
        rows = [e for e in (self.probe or {}).get("scale", []) if configuration in e.get("runs", []) and e.get("dist")]
        if not rows:
            return None
        return sum(max(0.0, e["dist"][0]["first_call_s"] - e["dist"][0]["median_s"]) for e in rows)

    def host(self, layout: Layout, shapes: Shapes, model: Model, work: Workload) -> float:
        """Host seconds a step spends issuing and completing its collectives besides moving bytes: each call the rank
        makes in a step (an exchange's every A steps, amortised) times what one call cost the probe's host on a
        one-rank group (probe.json's host.collective_s); 0 without a probe that measured it."""
        cost = ((self.probe or {}).get("host") or {}).get("collective_s")
        if not cost:
            return 0.0
        ranks = group_ranks(layout)
        calls = sum(t.calls / (layout.A if t.per == "aggregation" else 1)
                    * cost.get(t.collective, cost["all_reduce"])["median_s"]
                    for t in transfers(layout, shapes, model, work.activations) if ranks[t.group] > 1)
        return calls


@dataclass(frozen=True)
class Workload:
    """What each data-parallel rank computes per step: the model's sequences (`batch` of `seq_len` tokens, in
    `microbatches` under pipeline parallelism) at a precision."""
    llama_kwargs: dict
    batch: float
    seq_len: int
    precision: str
    microbatches: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    prefetch: bool = True  # train.prefetch: FSDP2's all-gathers issued one unit ahead (the schedule prices it)

    @property
    def activations(self) -> Activations:
        return Activations.of(self.llama_kwargs, self.batch, self.seq_len, self.microbatches, self.sequence_parallel)
