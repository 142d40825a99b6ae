"""action=dryrun, and action=plan with plan.dryrun=true: every planned run's own training code played on fake
tensors at its real world size (train.job.dryrun), one process per run and pipeline stage, before anything queues.

Runs that differ only in what leaves a device's work alone (run id, output folder, seed, step count, A) share one
dry-run. Each writes its measured memory beside the model's into plan.json (`memory`), and the collectives it issued
into dryrun.json with `traffic`: the bytes each rank sends per group, per step and per aggregation, as the dry-run
issued them and as the step-time model prices them (launcher.placement.steptime.transfers). A run whose dry-run
breaks, or whose peak does not fit the device less the reserve (cluster.memory_reserve_GB), is refused in one line
before submission.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launcher.placement.alphabeta import bus_factor
from launcher.placement.memory import human_bytes
from launcher.sweep import Run
from train.contract.common import ConfigError, write_atomic
from train.contract.layout import NAMES
from train.contract.spec import RunSpec

GB = 1e9
TIMEOUT_S = 600  # one rank of one run; an 8B model at 512 ranks takes about a minute (train.job.dryrun)
SHARED = ("run_id", "config", "repeat", "out_dir", "seed", "steps", "A", "log_every", "eval_every", "checkpoint_every",
          "target_ppl")


def work_key(run: Run) -> str:
    """What a device's work depends on: the spec less the keys in SHARED."""
    raw = run.spec.to_dict()
    keep = {k: v for k, v in raw.items() if k not in SHARED}
    keep["train"] = {k: v for k, v in raw["train"].items() if k not in SHARED}
    return json.dumps(keep, sort_keys=True)


def ranks_to_play(spec: RunSpec) -> list[int]:
    """One rank per pipeline stage (the first holds the embedding, the last the loss; data-parallel and tensor-
    parallel ranks hold the same up to a rounding of the shard)."""
    dims = spec.layout
    return [dims.rank((0, 0, 0, p, 0)) for p in range(dims.P)]


def play(spec: RunSpec, rank: int, folder: Path) -> dict:
    """train.job.dryrun for one rank of `spec`, in a process of its own (fake process groups are process-wide)."""
    spec_path, out = folder / f"spec-{rank}.json", folder / f"dryrun-{rank}.json"
    spec.save(spec_path)
    try:
        done = subprocess.run([sys.executable, "-m", "train.job.dryrun", str(spec_path), str(out), str(rank)],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the dry-run of rank {rank} took over {TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("fedshard: error:")]
        why = lines[-1].removeprefix("fedshard: error: ") if lines else (done.stderr.strip().splitlines() or
                                                                          ["no output"])[-1]
        raise ConfigError(f"dry-run of rank {rank}: {why.removeprefix(spec.run_id + ': ')}")
    return json.loads(out.read_text())


def memory_of(reports: list[dict]) -> tuple[int, int]:
    """(training peak, after-training peak) of the rank holding the most."""
    return (max(r["dryrun_peak_bytes"] for r in reports), max(r["dryrun_after_training_bytes"] for r in reports))


def collective_kind(op: str) -> str:
    """The alpha-beta kind of a c10d op (train.job.dryrun's names); point-to-point sends count as a broadcast."""
    for part, kind in (("reduce_scatter", "reduce_scatter"), ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
                       ("gather", "all_gather"), ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
                       ("barrier", "barrier")):
        if part in op:
            return kind
    return "broadcast"


def sent_bytes(report: dict, spec: RunSpec) -> dict[str, dict[str, float]]:
    """{per: {group: bytes}} one played rank put on its links in the steady step and the aggregation: each
    collective's whole buffer times its bus factor on its group's ranks (steptime.wire_bytes does the same)."""
    size = dict(zip(NAMES, spec.layout.shape))
    out: dict[str, dict[str, float]] = {}
    for phase, per in (("step", "step"), ("aggregation", "aggregation")):
        for row in report["collectives"].get(phase, []):
            kind, ranks = collective_kind(row["op"]), 1
            for name in row["group"].split("+"):
                ranks *= size.get(name, 1)
            if kind != "barrier" and ranks > 1:
                sent = out.setdefault(per, {})
                sent[row["group"]] = sent.get(row["group"], 0.0) + row["bytes"] * bus_factor(kind, ranks)
    return out


def traffic(measured: dict, predicted: dict) -> dict[str, dict[str, dict]]:
    """{per: {group: {"model": bytes, "dryrun": bytes}}}: the two side by side, 0 where one sends nothing."""
    return {per: {group: {"model": predicted.get(per, {}).get(group, 0.0),
                          "dryrun": measured.get(per, {}).get(group, 0.0)}
                  for group in sorted({*predicted.get(per, {}), *measured.get(per, {})})}
            for per in ("step", "aggregation") if per in predicted or per in measured}


def _traffic_line(sides: dict) -> str:
    return "; ".join(f"per {per}: " + ", ".join(f"{group} {human_bytes(v['dryrun'])} (model {human_bytes(v['model'])})"
                                                for group, v in groups.items())
                     for per, groups in sides.items())


def dryrun(settings, runs: list[Run], model_bytes: dict[str, float], model_sent: dict[str, dict],
           out_dir: Path) -> dict[str, dict]:
    """Play every run (shared where the work is the same); print progress; refuse what breaks or cannot fit;
    write out_dir/dryrun.json; return each run's `memory` block for plan.json. `model_sent`: each run's bytes sent per
    step and aggregation by group, as the step-time model has them (plan.sent_bytes)."""
    cluster = settings.cluster
    device = cluster.gpu_memory_GB * GB if cluster.gpu_memory_GB else None
    reserve = (cluster.memory_reserve_GB or 0.0) * GB
    played: dict[str, tuple[str, list[dict]]] = {}
    out: dict[str, dict] = {}
    by_run: dict[str, dict] = {}
    keys = {run.run_id: work_key(run) for run in runs}
    distinct = list(dict.fromkeys(keys.values()))
    with tempfile.TemporaryDirectory(prefix="fedshard-dryrun-") as tmp:
        for run in runs:
            key = keys[run.run_id]
            if key not in played:
                started = time.perf_counter()
                print(f"  dry-run {distinct.index(key) + 1}/{len(distinct)}: {run.run_id} "
                      f"({run.spec.world_size} ranks, playing rank(s) {ranks_to_play(run.spec)}) ...", flush=True)
                try:
                    reports = [play(run.spec, rank, Path(tmp)) for rank in ranks_to_play(run.spec)]
                except ConfigError as exc:
                    raise ConfigError(f"{run.run_id}: {exc}") from None
                peak, after = memory_of(reports)
                print(f"    peak {peak / GB:.3g} GB in training, {after / GB:.3g} GB after "
                      f"(model {model_bytes[run.run_id] / GB:.3g} GB), {time.perf_counter() - started:.1f} s",
                      flush=True)
                played[key] = (run.run_id, reports)
            source, reports = played[key]
            sides = traffic(sent_bytes(reports[0], run.spec), model_sent[run.run_id])  # rank 0: the first stage,
            print(f"    {run.run_id} sends {_traffic_line(sides)}", flush=True)   # which the model prices
            peak, after = memory_of(reports)
            memory = {"model_bytes": int(model_bytes[run.run_id]), "dryrun_peak_bytes": peak,
                      "dryrun_after_training_bytes": after, "reserve_bytes": int(reserve),
                      "device_bytes": int(device) if device else None}
            check_fits(run.run_id, memory)  # before anything is written
            out[run.run_id] = memory
            by_run[run.run_id] = {"played_as": source, "traffic": sides} | \
                ({"ranks": reports} if source == run.run_id else {})
    write_atomic(out_dir / "dryrun.json", json.dumps(by_run, indent=1) + "\n")
    return out


def check_fits(run_id: str, memory: dict) -> None:
    """Refuse a run whose measured peak (training or after it) exceeds the device less the reserve."""
    if not memory["device_bytes"]:
        return
    room = memory["device_bytes"] - memory["reserve_bytes"]
    peak = max(memory["dryrun_peak_bytes"], memory["dryrun_after_training_bytes"])
    if peak > room:
        raise ConfigError(f"{run_id}: its dry-run peaks at {peak / GB:.3g} GB per device but a device has "
                          f"{memory['device_bytes'] / GB:.3g} GB less {memory['reserve_bytes'] / GB:.3g} GB kept "
                          f"free (cluster.memory_reserve_GB) = {room / GB:.3g} GB: shard more (S), split the model "
                          f"(train.tp, train.pp) or set train.activation_checkpointing=full")
