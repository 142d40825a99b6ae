"""Predicted seconds per optimizer step: compute and every collective the run issues, each priced with the alpha and
bandwidth of the level it crosses, scheduled as one rank runs them (launcher.placement.schedule), the sum and max kept
as its limits (launcher.placement.costmodel keeps the paper's communication-only formulas). Pure arithmetic, no torch:
plan ranks hundreds of layouts with it.

What one step sends (train.parallel.parallelize.shard: torchtitan's units, the embedding, each decoder layer and
lm_head; the final norm, in the root unit, is priced with lm_head; tied embeddings stay in the root unit):
- shard group (S ranks): per unit an all_gather in forward, another in backward for the embedding and each layer
  (lm_head, which backward needs first, and the root stay gathered after forward), and a reduce_scatter of its
  gradient; under pipeline parallelism no unit is resharded after forward, so each is gathered once a step
  whatever the microbatches;
- replicate group (R ranks, HSDP): an all_reduce of each unit's gradient shard;
- federation, every A steps (F groups): the rank's whole shard averaged in FEDAVG_CHUNK_BYTES chunks (fp32:
  one all_reduce each; 16-bit: all_to_all + all_gather, the same bytes); in FL+HSDP each replica averages 1/R of
  each chunk across the groups and an all_gather over the replicate group puts the chunk together.
A collective of `size` bytes on n ranks takes alpha + size x busfactor(n) x flows / link at the busiest level
it crosses, where flows is how many of the layout's concurrent groups share that level's busiest link.
Nothing in a step or an average synchronises the whole world: an average asks no rank before it (its chunks are
written back only where finite, train.federation.federated), and phases are timed with device events, without
barriers (train.measure.metrics).
With tensor and pipeline parallelism (the layout's P and T) a rank holds the largest stage's ceil(L / pp) layers, each
split over tp ranks (stage_shapes), and the units above shrink accordingly; besides:
- tensor group (tp ranks, one node), per layer and microbatch, as train.parallel.tensor's DTensor plan issues them (the
  dry-run counts them, launcher.actions.dryrun): an all_reduce of the activations after attention and after the MLP in
  forward, and in backward one of the input gradient of each column-wise matrix (q, k, v, gate, up: five, not a
  fused QKV's two); lm_head (without pipeline stages: the first stage, priced, has none) gathers the logits
  (all_gather) and all-reduces its input's gradient. With sequence parallelism the two forward all-reduces
  become reduce_scatters, whose gradients are all_gathers, the attention and MLP inputs are all_gathered, and
  each stage adds two all_gathers (its output in forward, its input's gradient in backward); the five backward
  all-reduces stay (a Megatron layout would reduce-scatter one sum instead);
- pipeline (pp stages): a stage sends each of the m microbatches' activations forward and receives its
  gradient back (or the reverse), each priced as a broadcast between two ranks on the level the stages cross,
  and the schedule's m + pp - 1 slots each way, not m, lie on the critical path;
- compute: the rank's 1 / (pp x tp) of the model's, stretched by the bubble to (m + pp - 1) / m of it, the root's
  share (Compute.root_s) on its unit and the rest spread over the layers.
Nothing overlaps the tensor and pipeline traffic: it sits on the critical path of every layer and slot.
Where the probe measured the layout's own stage step in place (Compute.in_place, train.measure.calibrate_layout; the
probe does so for every run of its sweep, pp = tp = 1 included), that measurement replaces the last three items: it
holds the split compute, the bubble and the tensor and pipeline traffic as this machine runs them, which the parts
above priced up to 71 % short on the testbed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from launcher.placement.allocate import Placement, communicators
from launcher.placement.alphabeta import bus_factor
from launcher.placement.costmodel import LLAMA_KEYS, Model, llama_params
from launcher.placement.levels import traffic
from launcher.placement.network import Network
from launcher.placement.schedule import Comm, Execution, Pipeline, Unit, run
from launcher.placement.topology import Topology
from train.contract.layout import Layout
from train.contract.presets import flops_per_token
from train.contract.spec import FEDAVG_CHUNK_BYTES

ASSUMED_MFU = 0.4  # model FLOPs utilisation assumed when compute is estimated from peak_flops (not measured)


@dataclass(frozen=True)
class Shapes:
    """Parameters of the FSDP units: the embeddings, lm_head and final norm (`root`) and each decoder layer (a rank's
    share of them under tensor parallelism, stage_shapes)."""

    root: float
    layer: float
    layers: int
    tied: bool = False  # tie_word_embeddings: one matrix for the embedding and lm_head, kept in one unit

    @classmethod
    def of(cls, llama_kwargs: dict) -> "Shapes":
        def count(layers: int) -> int:
            kwargs = {k: llama_kwargs[k] for k in LLAMA_KEYS}
            return llama_params(**{**kwargs, "num_hidden_layers": layers},
                                tie_word_embeddings=llama_kwargs.get("tie_word_embeddings", False))
        root = count(0)
        return cls(root, count(1) - root, llama_kwargs["num_hidden_layers"],
                   bool(llama_kwargs.get("tie_word_embeddings", False)))


@dataclass(frozen=True)
class Activations:
    """What travels between tensor-parallel ranks and pipeline stages besides the parameters: one data-parallel
    rank's tokens per step in microbatches, their width, and the vocabulary of the logits."""

    microbatches: int = 1
    tokens: float = 0  # per step of one data-parallel rank: batch x seq_len
    hidden: int = 0
    vocab: int = 0
    sequence_parallel: bool = False  # under tp: all-gather + reduce-scatter in place of each all-reduce

    @classmethod
    def of(cls, llama_kwargs: dict, batch: float, seq_len: int, microbatches: int = 1,
           sequence_parallel: bool = False) -> "Activations":
        """`batch`: sequences per data-parallel rank."""
        return cls(microbatches, batch * seq_len, llama_kwargs["hidden_size"], llama_kwargs["vocab_size"],
                   sequence_parallel)


def stage_shapes(shapes: Shapes, P: int, T: int) -> Shapes:
    """The units one rank of the largest stage holds before FSDP shards them: the whole root without pipeline
    stages (embedding + lm_head / tp), else the embedding of the first stage (the larger end); ceil(L / pp)
    layers, each split over tp."""
    half = shapes.root / 2  # embedding and lm_head, untied: vocabulary x hidden each
    return Shapes(half + half / T if P == 1 else half, shapes.layer / T, -(-shapes.layers // P), shapes.tied)


def root_units(shapes: Shapes, T: int) -> tuple[float, float]:
    """(embedding, lm_head with the final norm) as train.parallel.parallelize.shard wraps them without pipeline
    stages, a rank's share under tp; tied embeddings are one unit, counted as the head's."""
    stage = stage_shapes(shapes, 1, T)
    embedding = 0.0 if shapes.tied else shapes.root / 2
    return embedding, stage.root - embedding


def gathers(shapes: Shapes, P: int, T: int) -> list[tuple[float, int]]:
    """(parameters, all_gathers a step) of each FSDP unit of the largest stage (module docstring): without
    pipeline stages the embedding and each layer twice, lm_head with the final norm once; with them every unit
    once."""
    stage = stage_shapes(shapes, P, T)
    layers = [(stage.layer, 1 if P > 1 else 2)] * stage.layers
    if P > 1:
        return [(stage.root, 1)] + layers
    embedding, head = root_units(shapes, T)
    return [(embedding, 2)] * bool(embedding) + [(head, 1)] + layers


@dataclass(frozen=True)
class Compute:
    """One rank's forward, backward and optimizer seconds for the whole model at its batch (every rank
    computes every layer on its own batch; the optimizer updates only the rank's 1/S shard)."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    source: str
    in_place: bool = False  # a layout's own stage (its whole model at pp = tp = 1), measured in place
                            # (train.measure.calibrate_layout): one rank's share, bubble and tp/pp traffic in it
    root_s: tuple[float, float] | None = None  # (forward, backward) of the root (embeddings, lm_head, loss), part of
                                               # the above: the schedule puts it on its unit; None: all on the layers
    cpu_s: float | None = None  # in place: the mean rank's CPU seconds in that step (None: not measured)

    @classmethod
    def estimated(cls, llama_kwargs: dict, batch: int, seq_len: int, peak_flops: float) -> "Compute":
        """Training FLOPs per token (train.contract.presets.flops_per_token), a third in forward, at ASSUMED_MFU of
        peak; the optimizer is not estimated. The root's share is lm_head's matmul (the embedding is a lookup)."""
        shapes = Shapes.of(llama_kwargs)
        params = shapes.root + shapes.layers * shapes.layer
        vocab, hidden = llama_kwargs["vocab_size"], llama_kwargs["hidden_size"]
        per_token = flops_per_token(vocab, hidden, shapes.layers, params, seq_len)
        seconds = batch * seq_len * per_token / (peak_flops * ASSUMED_MFU)
        root = seconds * flops_per_token(vocab, hidden, 0, shapes.root, seq_len) / per_token
        return cls(seconds / 3, 2 * seconds / 3, 0.0, f"estimated from peak_flops at {ASSUMED_MFU:.0%} MFU",
                   root_s=(root / 3, 2 * root / 3))


@dataclass(frozen=True)
class StepTime:
    compute_s: float | None  # as the schedule ran it (CPU: processor-shared); None: no probe, no peak_flops
    comm_s: dict             # seconds per step by group kind: shard, replicate, federation (amortised over A)
    no_overlap_s: float      # the schedule's upper limit: compute as given + all communication + the host's calls
    full_overlap_s: float    # the old max: forward/backward hide the shard and replicate traffic perfectly, FedAvg
                             # never overlaps (the schedule's lower limit where the two kinds share their links)
    step_s: float            # the estimate: the step's schedule (launcher.placement.schedule)
    compute_source: str
    exposed_s: dict = field(default_factory=dict)           # what the compute stream waited for, by group kind
    exposed_by_level_s: dict = field(default_factory=dict)  # the same by link level (node, leaf, spine, ...)
    phases_s: dict = field(default_factory=dict)            # forward, backward, optimizer, aggregation


def load(placement: Placement, layout: Layout, topo: Topology) -> dict[str, dict[int, int]]:
    """{group kind: {level: flows}} of a placed layout (levels.traffic of all its groups of that kind)."""
    host = dict(zip(placement.coords, placement.hosts))
    return {kind: traffic([[host[c] for c in g] for g in groups], topo)
            for kind, groups in communicators(layout).items()}


@dataclass(frozen=True)
class Transfer:
    """Collectives of one kind a rank issues: `calls` of `size` bytes (the whole buffer) over one of its groups
    (a mesh dimension: shard, replicate, fed, tp, pp), in every step or in every aggregation (`per`)."""

    per: str  # "step" | "aggregation"
    group: str
    collective: str
    size: float
    calls: int


LOADS = {"shard": "shard", "replicate": "replicate", "fed": "federation", "tp": "tensor", "pp": "pipeline"}


def transfers(layout: Layout, shapes: Shapes, model: Model, acts: Activations = Activations()) -> list:
    """What one rank sends (module docstring), in the order step_time sums it; `model` gives the bytes per
    parameter of each collective (costmodel), activations travel in the parameters' all-gather dtype."""
    gather_b, grad_b = model.bytes_per_param, model.grad_bytes_per_param or model.bytes_per_param
    F, S, P, T = layout.F, layout.S, layout.P, layout.T
    stage = stage_shapes(shapes, P, T)
    unit_gathers = gathers(shapes, P, T)
    units = [p for p, _ in unit_gathers]
    out = []
    m = acts.microbatches
    for p, calls in unit_gathers:
        out += [Transfer("step", "shard", "all_gather", p * gather_b, calls),
                Transfer("step", "shard", "reduce_scatter", p * grad_b, 1)]
    out += [Transfer("step", "replicate", "all_reduce", p / S * grad_b, 1) for p in units]
    if F > 1:
        shard_bytes = sum(units) / S * (model.fedavg_bytes_per_param or gather_b)
        chunks = max(1, -(-int(shard_bytes) // FEDAVG_CHUNK_BYTES))
        exchange = "all_reduce" if (model.fedavg_bytes_per_param or gather_b) >= 4 else "all_to_all"
        # each replica averages its 1/R of every chunk across the groups, then the replicas gather the pieces
        out += [Transfer("aggregation", "fed", exchange, shard_bytes / chunks / layout.R, chunks),
                Transfer("aggregation", "replicate", "all_gather", shard_bytes / chunks, chunks)]
    micro = acts.tokens / m * acts.hidden * gather_b  # one microbatch's activations
    L = stage.layers
    if T > 1:
        if P == 1:  # lm_head (the first stage, the one priced, has none)
            out += [Transfer("step", "tp", "all_reduce", micro, m),
                    Transfer("step", "tp", "all_gather", acts.tokens / m * acts.vocab * gather_b, m)]
        if acts.sequence_parallel:
            out += [Transfer("step", "tp", "all_reduce", micro, m * 5 * L),
                    Transfer("step", "tp", "all_gather", micro, m * (4 * L + 2)),
                    Transfer("step", "tp", "reduce_scatter", micro, m * 2 * L)]
        else:
            out.append(Transfer("step", "tp", "all_reduce", micro, m * 7 * L))
    if P > 1:
        out.append(Transfer("step", "pp", "broadcast", micro, 2 * m))
    return out


def group_ranks(layout: Layout) -> dict[str, int]:
    """Ranks of each group a transfer crosses (a pipeline send joins two stages)."""
    return {"shard": layout.S, "replicate": layout.R, "fed": layout.F, "tp": layout.T, "pp": 2 if layout.P > 1 else 1}


def wire_bytes(moved: list, ranks: dict[str, int]) -> dict[str, dict[str, float]]:
    """{per: {group: bytes}}: what each rank puts on its links, the whole buffer times nccl-tests' bus factor
    (an all_to_all as the all_reduce it replaces: its all_to_all and all_gather)."""
    out: dict[str, dict[str, float]] = {}
    for t in moved:
        if ranks[t.group] > 1:
            kind = "all_reduce" if t.collective == "all_to_all" else t.collective
            per = out.setdefault(t.per, {})
            per[t.group] = per.get(t.group, 0.0) + t.calls * t.size * bus_factor(kind, ranks[t.group])
    return out


class Links(NamedTuple):
    """Where a layout's bytes go: the network's latency and bandwidth per level, and how many flows share each
    level's busiest link in this placement (load)."""
    network: Network
    loads: dict[str, dict[int, int]]


def step_time(layout: Layout, shapes: Shapes, model: Model, links: Links, compute: Compute | None,
              overlap: bool, acts: Activations = Activations(), how: Execution = Execution()) -> StepTime:
    """The step of one layout, scheduled (launcher.placement.schedule); `model` gives the bytes per parameter each
    collective sends (costmodel); `overlap`: on GPU, where communication streams run beside compute (False: CPU,
    gloo); `acts`: what tensor and pipeline parallelism send; `how`: prefetch, the cores CPU ranks share. The old
    sum (no overlap) and max (full overlap) stay as the schedule's limits."""
    F, S, A, P, T, m = layout.F, layout.S, layout.A, layout.P, layout.T, acts.microbatches
    moved, ranks, loads = transfers(layout, shapes, model, acts), group_ranks(layout), links.loads
    once: dict[tuple, float] = {}  # the layers' collectives are alike: each priced once

    def priced(t: Transfer) -> float:
        key = (t.collective, t.size, t.group)
        if key not in once:
            once[key] = links.network.seconds(t.collective, t.size, ranks[t.group], loads[LOADS[t.group]])
        return t.calls * once[key]

    def seconds(per: str, *groups: str) -> float:
        return sum(priced(t) for t in moved if t.per == per and t.group in groups)

    federation = seconds("aggregation", *LOADS) / A if F > 1 else 0.0
    shard, replicate = seconds("step", "shard"), seconds("step", "replicate")
    comm = {"shard": shard, "replicate": replicate, "federation": federation}
    in_place = compute is not None and compute.in_place
    pipe, tensor, exchange = Pipeline(), None, ()
    if P * T > 1 and not in_place:
        slots = (m + P - 1) / m  # the schedule's slots each way, all on the path
        comm |= {"tensor": seconds("step", "tp"), "pipeline": seconds("step", "pp") * slots}
        pipe = Pipeline(m, P, _comm(seconds("step", "pp") / (2 * m), "pp", loads))
        tensor = _comm(comm["tensor"], "tp", loads)
    if F > 1:  # each collective of the exchange on its own group's links, every A steps
        exchange = tuple(c for t in moved if t.per == "aggregation"
                         if (c := _comm(priced(t) / A, t.group, loads, "federation")) is not None)
    if compute is None:
        hidden, exposed_compute, source = 0.0, 0.0, "unknown: no probe and no peak_flops (communication only)"
    elif in_place:
        hidden, source = compute.forward_s + compute.backward_s, compute.source
        exposed_compute = compute.optimizer_s / S
    else:
        bubble = (m + P - 1) / m
        hidden, source = (compute.forward_s + compute.backward_s) / (P * T) * bubble, compute.source
        exposed_compute = compute.optimizer_s / (S * P * T)
    exposed = federation + comm.get("tensor", 0.0) + comm.get("pipeline", 0.0)
    # the host's cost per call: on CPU the same cores' work, on GPU issued beside the device's
    no_overlap = hidden + exposed_compute + shard + replicate + exposed + how.host_s
    full_overlap = max(hidden, shard + replicate) + exposed_compute + exposed
    full_overlap = max(full_overlap, how.host_s) if overlap else full_overlap + how.host_s
    plan = run(*units_of(layout, shapes, model, links, compute), overlap, how, pipe, tensor, exchange)
    return StepTime(None if compute is None else plan.compute_s, comm, no_overlap, full_overlap, plan.step_s, source,
                    plan.exposed_s, plan.exposed_by_level_s, plan.phases_s)


def _comm(seconds: float, group: str, loads: dict, kind: str | None = None) -> Comm | None:
    """`seconds` of a group's collective as the schedule holds it: on the links its group's load names."""
    load = loads.get(LOADS[group])
    return Comm(seconds, kind or LOADS[group], tuple(load)) if seconds > 0 and load else None


def units_of(layout: Layout, shapes: Shapes, model: Model, links: Links, compute: Compute | None) -> tuple:
    """(the largest stage's FSDP units in forward order, each with its compute and collectives priced; the
    optimizer's seconds on the rank's shard). Units of one size are priced once: plan ranks hundreds of layouts."""
    S, P, T = layout.S, layout.P, layout.T
    gather_b, grad_b = model.bytes_per_param, model.grad_bytes_per_param or model.bytes_per_param
    ranks, net = group_ranks(layout), links.network

    def priced(collective: str, size: float, group: str) -> Comm | None:
        return _comm(net.seconds(collective, size, ranks[group], links.loads.get(LOADS[group]) or {}), group,
                     links.loads)

    in_place = compute is not None and compute.in_place
    stage = stage_shapes(shapes, P, T)
    if P == 1:  # forward order: the embedding, the layers, lm_head with the final norm (the root's compute)
        embedding, head = root_units(shapes, T)
        kinds = ["embedding"] * bool(embedding) + ["layer"] * stage.layers + ["root"]
        params = {"embedding": embedding, "layer": stage.layer, "root": head}
    else:  # the stage's root (the first stage's embedding) and its layers, none resharded after forward
        kinds, params = ["root"] + ["layer"] * stage.layers, {"root": stage.root, "layer": stage.layer}
    work = {kind: (0.0, 0.0) for kind in kinds}
    optimizer = 0.0
    if compute is not None:
        split = 1 if in_place else P * T
        forward, backward = compute.forward_s / split, compute.backward_s / split
        optimizer = compute.optimizer_s / (S if in_place else S * P * T)
        root = (forward, backward) if not stage.layers else (0.0, 0.0)
        if compute.root_s and (P == 1 or in_place) and stage.layers:
            scale = 1 if in_place else T
            root = (min(compute.root_s[0] / scale, forward), min(compute.root_s[1] / scale, backward))
        work["root"] = root
        if stage.layers:
            work["layer"] = ((forward - root[0]) / stage.layers, (backward - root[1]) / stage.layers)
    unit = {kind: Unit(*work[kind], priced("all_gather", p * gather_b, "shard"),
                       priced("reduce_scatter", p * grad_b, "shard"),
                       priced("all_reduce", p / S * grad_b, "replicate"), P == 1 and kind != "root")
            for kind, p in params.items() if kind in work}
    return [unit[kind] for kind in kinds], optimizer
