"""The step-time model fed with what is known about this cluster: a probe (cluster.probe, else this sweep's
probe.json) for alpha/beta per level and measured compute, otherwise nominal bandwidth and peak_flops."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from launcher.placement.allocate import Placement
from launcher.placement.costmodel import LLAMA_KEYS, Model
from launcher.placement.steptime import (
    Activations,
    Compute,
    Links,
    Network,
    Shapes,
    StepTime,
    load,
    step_time,
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
                return Compute(per["forward_s"], per["backward_s"], per["optimizer_s"], source)
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
                return Compute(per["forward_s"], per["backward_s"], per["optimizer_s"],
                               "the layout's stage measured in place by the probe", in_place=True)
        return None

    def step(self, layout: Layout, work: Workload, model: Model, placement: Placement) -> StepTime:
        """`layout` placed as `placement`, doing `work`."""
        if placement.loads is None:
            placement.loads = load(placement, layout, self.topo)
        return step_time(layout, Shapes.of(work.llama_kwargs), model, Links(self.network, placement.loads),
                         self.compute(layout, work), overlap=self.cluster.device == "cuda", acts=work.activations)


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

    @property
    def activations(self) -> Activations:
        return Activations.of(self.llama_kwargs, self.batch, self.seq_len, self.microbatches, self.sequence_parallel)
