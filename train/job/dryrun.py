"""A run checked before it queues: its own code on fake tensors and a fake process group of its real world size.

One process plays one rank of the run (a GPU's work, without the GPU): the mesh, the model built and parallelised
as training does it, the optimizer, two training steps, one aggregation (FedAvg or DiLoCo as the spec says), the
evaluation and the checkpoint's state dict, all through train.loop.Trainer. Fake tensors hold shapes, not data, so
an 8B model at 512 ranks takes 50-100 s on 2 cores; every collective returns at once, its contents unknown. The
second step measured is the first after step 0 that does not aggregate (the steady state).

What it measures, per phase:
- memory: torch's FSDPMemTracker counts every storage the rank holds (parameters, gradients, optimizer states,
  activations, collective buffers, temporaries). Attention is the fused kernel's (train.model asks for sdpa, and
  on CPU sdpa runs the flash kernel, which keeps the output and one log-sum-exp per row, as a GPU's flash or
  memory-efficient kernel does); `attention` in the report names the kernels seen, so a math-path score matrix
  would show. The optimizer runs its for-loop: fake tensors' in-place foreach kernels allocate a new output per
  call (AdamW's step measured 864 MiB against 248 MiB for the for-loop and for foreach on real tensors: 8 Linear
  4096 layers in bf16, world 8), so foreach's one moment-sized temporary list is not in the figure.
- collectives: each one this rank issues (op, the mesh dimensions of its group, bytes of the full tensor it
  reduces or gathers: an all-gather's output, a reduce-scatter's input), by phase.
- host syncs: a read of a tensor's value (`.item()`, `.tolist()`, `bool(t)`). In a training step it ends the
  dry-run, naming the call (train/ frames); in the phases that may sync (aggregation, evaluation, checkpoint) it is
  counted and answered with zero (0, 0.0, False), which every check the trainer reads back takes as "all
  clear" (no group disagrees, no step was non-finite). Two reads are not the device's: AdamW's step counter (a
  host tensor unless fused) and torch's pipelining's one vote at the first step. Fake tensors dispatch reads that
  real ones answer in C++ (`.tolist()` reads each element), so counts outside the steps are upper bounds.
What it cannot see: copies between host and device, which are no-ops on CPU.
"""
from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from collections import defaultdict
from contextlib import contextmanager
from itertools import combinations
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from train import loop
from train import model as models
from train.contract.common import FedshardError, write_atomic
from train.contract.layout import NAMES
from train.contract.spec import RunSpec
from train.data import sources as data
from train.parallel import mesh as meshes

COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd")  # a wait on one already counted, a wrapper
STEPS = ("first_step", "step")  # the first step may set things up once (torch's pipelining votes on shapes)
THIS_PACKAGE = str(Path(__file__).parent)


class DryRunError(FedshardError):
    """The run's code broke on fake tensors: a shape, a group, a host sync in a step."""


class Watch(TorchDispatchMode):
    """Counts collectives (op, group, bytes) and host syncs by phase; a host sync in a step is refused."""

    def __init__(self, groups: dict[frozenset, str], fake: bool):
        super().__init__()
        self.groups = groups  # the ranks of a group -> the mesh dimensions it spans ("shard", "replicate+shard", ...)
        self.fake = fake  # fake tensors: a host read gets a stand-in (train.job.dryrun's docstring)
        self.strict = True  # a host read in the steady step is refused (exercise: not when that step aggregates)
        self.phase = "build"
        self.collectives: dict[str, dict[tuple, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.syncs: dict[str, int] = defaultdict(int)
        self.attention: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # let DTensor lower to local ops and collectives, which come back here
        namespace, name = func.namespace, func._schema.name.split("::")[-1]
        if func is torch.ops.aten._local_scalar_dense.default:
            stand_in = self._host_read(args[0])
            return stand_in if self.fake else func(*args, **kwargs)
        if "attention" in name:
            self.attention.add(name)
        if namespace in COLLECTIVE_NAMESPACES and name not in NOT_COLLECTIVES:
            tensors = [t for t in _flat(args, kwargs) if isinstance(t, torch.Tensor)]
            full = max((t.numel() * t.element_size() for t in tensors), default=0)
            if name == "all_gather_into_tensor":  # functional (tensor parallelism): given the shard, returns
                full *= args[1]                   # the whole, group_size times larger
            count = self.collectives[self.phase][(name, self._group(args, kwargs))]
            count[0] += 1
            count[1] += full
        return func(*args, **kwargs)

    def _host_read(self, t: torch.Tensor):
        if _read_by("_get_value", "torch/optim"):
            return 1.0  # AdamW's step count lives on the host (not fused, not capturable): no GPU to wait for
        if _read_by("_warmup_p2p", "torch/distributed/pipelining"):
            self.syncs[self.phase] += 1  # torch's pipelining asks once whether every stage knows its shapes: they
            return 1  # all run this code, so each answers as this one, which was given them (train.parallel.pipeline)
        if self.phase == "step" and self.strict:
            raise DryRunError(f"a host sync in a training step: {_caller()} reads a tensor's value "
                              f"(.item(), .tolist() or bool), which waits for the GPU")
        self.syncs[self.phase] += 1
        return False if t.dtype == torch.bool else 0.0 if t.is_floating_point() else 0

    def _group(self, args, kwargs) -> str:
        for a in _flat(args, kwargs):
            pg = _process_group(a)
            if pg is not None:
                return self.groups.get(frozenset(dist.get_process_group_ranks(pg)), "other")
        return "world"

    def report(self) -> dict:
        return {"collectives": {phase: [{"op": op, "group": group, "count": n, "bytes": b}
                                        for (op, group), (n, b) in sorted(counts.items())]
                                for phase, counts in self.collectives.items()},
                "host_syncs": dict(self.syncs), "attention": sorted(self.attention)}


def _flat(args, kwargs) -> list:
    out = []
    for a in [*args, *kwargs.values()]:
        out.extend(a if isinstance(a, (list, tuple)) else [a])
    return out


def _process_group(a):
    if isinstance(a, dist.ProcessGroup):
        return a
    if isinstance(a, torch.ScriptObject):
        try:
            return dist.ProcessGroup.unbox(a)
        except (RuntimeError, TypeError):
            return None
    if isinstance(a, str) and a:  # functional collectives name their group
        try:
            return dist.distributed_c10d._resolve_process_group(a)
        except (RuntimeError, ValueError, KeyError):
            return None
    return None


def _read_by(function: str, where: str) -> bool:
    """Whether `function` in a file under `where` (a path fragment) made this read."""
    return any(f.name == function and where in f.filename for f in traceback.extract_stack()[-8:])


def _caller() -> str:
    """The innermost train/ frame below this module (the line that asked) and the innermost frame outside torch's
    dispatch machinery (the line that read)."""
    stack = [f for f in traceback.extract_stack()[:-3] if "/torch/utils/_python_dispatch" not in f.filename
             and "/torch/_compile" not in f.filename and "/torch/_dynamo" not in f.filename]
    ours = [f for f in stack if f.filename.startswith(THIS_PACKAGE) and not f.filename.endswith("dryrun.py")]
    where = [f"{Path(f.filename).name}:{f.lineno} ({f.line})" for f in (ours[-1:] + stack[-1:])]
    return " via ".join(dict.fromkeys(where)) or "an unknown call"


def group_names(mesh) -> dict[frozenset, str]:
    """The ranks of every group this rank can be in, by the mesh dimensions it spans."""
    ranks = mesh.mesh
    coord = mesh.get_coordinate()
    out = {}
    for k in range(1, len(NAMES) + 1):  # the fewest dimensions: a size-1 dimension adds no rank
        for dims in combinations(range(len(NAMES)), k):
            index = tuple(slice(None) if d in dims else coord[d] for d in range(len(NAMES)))
            out.setdefault(frozenset(ranks[index].flatten().tolist()), "+".join(NAMES[d] for d in dims))
    return out


class Peaks:
    """Peak bytes per phase from one FSDPMemTracker over the whole dry-run."""

    def __init__(self, tracker: FSDPMemTracker):
        self.tracker = tracker
        self.peaks: dict[str, int] = {}

    def total(self, kind: str) -> int:
        return sum(snap["Total"] for snap in self.tracker.get_tracker_snapshot(kind).values())

    @contextmanager
    def phase(self, name: str, watch: Watch):
        # the tracker keeps one running peak, which its reset_mod_stats leaves: start it from what is held now, once
        # garbage awaiting the cycle collector is gone (when it runs depends on the process's history: a real
        # run's eval was seen to start 2.1 MB higher than the same run's alone, twice in eight whole suites, with
        # only the young generations collected). Before each phase the young generations, what the phase before left
        # (a full collection before every phase made tests 60 % slower); before the evaluation, once, everything:
        # training's cycles may have reached the oldest generation by then.
        gc.collect(2 if name == "eval" else 1)
        self.tracker._peak_mem = {dev: snap["Total"] for dev, snap in self.tracker.get_tracker_snapshot().items()}
        watch.phase = name
        yield
        self.peaks[name] = max(self.peaks.get(name, 0), self.total("peak"))


def dryrun(spec: RunSpec, rank: int = 0) -> dict:
    """Play rank `rank` of `spec` on fake tensors (module docstring); the report as a JSON-able dict."""
    started = time.perf_counter()
    layout = spec.layout
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world)
    try:
        mesh = meshes.build("cpu", layout)
        # attention as the run's device takes it (a CUDA run in fp32 repeats the KV heads: train.model)
        config = models.for_device(models.llama_config(spec.model), "cuda" if spec.device == "cuda" else "cpu",
                                   spec.train.precision)
        source = data.for_run(spec, config.vocab_size)
        watch = Watch(group_names(mesh), fake=True)
        with FakeTensorMode(allow_non_fake_inputs=True), real_meshes():
            trainer = loop.Trainer(spec, rank, "cpu", config, source, mesh=mesh)
            peaks = exercise(trainer, watch)
    except DryRunError:
        raise
    except Exception as exc:  # a shape, a group: name the call that broke
        raise DryRunError(f"{type(exc).__name__} at {_failing_frame(exc)}: {str(exc).splitlines()[0][:300]}") \
            from exc
    finally:
        dist.destroy_process_group()
    return report(spec, rank, peaks, watch, time.perf_counter() - started)


@contextmanager
def real_meshes():
    """Device meshes that torch builds itself under fake tensors (fully_shard joins the data-parallel and tensor-
    parallel meshes) keep real rank tensors, as `meshes.build`'s do: a fake one cannot say where this rank is."""
    init = DeviceMesh.__init__

    def real_init(self, *args, **kwargs):
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_init
    try:
        yield
    finally:
        DeviceMesh.__init__ = init


def exercise(trainer: loop.Trainer, watch: Watch) -> dict[str, int]:
    """Two steps, an aggregation when federated, the evaluation and the checkpoint's state dict, each as training
    runs it; the peak bytes of each phase. Fake or real tensors alike (tests compare the two)."""
    for group in trainer.optimizer.param_groups:
        group["foreach"] = False  # module docstring
    tracker = FSDPMemTracker(trainer.model, trainer.optimizer)
    # held since the trainer was built: DiLoCo's synchronized copy and momentum, counted as optimizer state
    # (FSDPMemTracker's track_external is a no-op, MemTracker's names a category FSDPMemTracker lacks)
    for t in trainer.fedavg.device_state() if trainer.fedavg is not None else []:
        tracker._update_and_maybe_create_winfos(t, _FSDPRefType.OPT)
    peaks = Peaks(tracker)
    # the tracker refuses a module called twice between resets (evaluation batches, microbatches): reset first
    # (a global hook registered before the tracker's own global hooks runs before them)
    root = trainer.model
    hook = register_module_forward_pre_hook(lambda module, _: tracker.reset_mod_stats() if module is root else None)
    with tracker, watch:
        peaks.peaks["build"] = peaks.total("current")
        second, watch.strict = steady_step(trainer)
        for step, phase in zip((0, second), STEPS):
            with peaks.phase(phase, watch):
                trainer.step(step)
        if trainer.fedavg is not None:
            with peaks.phase("aggregation", watch):
                trainer.fedavg.average()
        with peaks.phase("eval", watch):
            trainer.evaluate(2)
        with peaks.phase("checkpoint", watch):
            trainer.checkpointer.state_dict(trainer.model, trainer.optimizer, trainer.state.step, trainer.fedavg)
    hook.remove()
    return peaks.peaks


def steady_step(trainer: loop.Trainer) -> tuple[int, bool]:
    """The step measured as the steady state, and that it may not read the device: the first after step 0 that
    does not aggregate; step 1 when every step aggregates (A = 1), which may not read either (an average reads
    nothing on the host: train.federation.federated)."""
    fed = trainer.fedavg
    if fed is None:
        return 1, True
    return next((i for i in range(1, 2 * fed.A + 1) if not fed.due(i + 1)), 1), True


def report(spec: RunSpec, rank: int, peaks: dict[str, int], watch: Watch, wall_s: float) -> dict:
    training = max(peaks[p] for p in (*STEPS, "aggregation") if p in peaks)
    return {"run_id": spec.run_id, "rank": rank, "coords": list(spec.layout.coords(rank)),
            "world_size": spec.layout.world, "peak_bytes": peaks, "dryrun_peak_bytes": training,
            "dryrun_after_training_bytes": max(peaks["eval"], peaks["checkpoint"]), **watch.report(),
            "wall_s": round(wall_s, 2)}


def _failing_frame(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(THIS_PACKAGE)]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{Path(f.filename).name}:{f.lineno} ({f.line})"


def main(argv: list[str]) -> int:
    """`python -m train.job.dryrun SPEC.json OUT.json [RANK]`: one rank's dry-run, written to OUT.json."""
    if len(argv) not in (2, 3):
        print("usage: python -m train.job.dryrun SPEC.json OUT.json [RANK]", file=sys.stderr)
        return 2
    try:
        spec = RunSpec.load(argv[0])
        report = dryrun(spec, int(argv[2]) if len(argv) == 3 else 0)
    except FedshardError as exc:
        print(f"fedshard: error: {spec.run_id if 'spec' in locals() else argv[0]}: {exc}", file=sys.stderr)
        return 2
    write_atomic(Path(argv[1]), json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
