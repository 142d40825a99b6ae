"""action=preflight: before a large launch, the nodes the sweep's widest run is placed on are checked where they
stand: a matrix multiply on every rank's device and a ping-pong between neighbouring nodes (train.job.preflight),
compared with each other and with the cluster's expected figures. A rank whose multiply runs below
preflight.fraction of the ranks' median, or a node whose links to both of its neighbours run below that fraction
of the other links at the same topology level, is named, and the action ends with
status 1 and the --exclude that leaves them out (neighbours' torchtitan users ask for this: one slow GPU or link
wastes the whole allocation). `cluster.preflight=true` runs the same check inside every SLURM run before it trains.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from launcher import scheduler as schedulers
from launcher.actions.outcome import failure_reason
from launcher.placement import topology
from launcher.placement.health import excluded, judge
from launcher.planning import widest_run
from launcher.settings import Settings
from launcher.slurm.hostlist import compress
from train.contract.common import SubmitError, write_atomic

GB = 1e9


@dataclass(frozen=True)
class PreflightJob:
    """The preflight as a picklable job on every rank of the widest run's placement."""

    device: str
    backend: str
    hosts_of: list[str]
    nbytes: int
    iters: int
    timeout_s: float
    out_path: str
    PRELOAD = ("train.job.preflight",)  # see train.job.TrainJob.PRELOAD

    def __call__(self) -> None:
        from train.job.preflight import run  # the job's side: torch only where ranks run

        run(self.device, self.backend, self.hosts_of, self.nbytes, self.iters, self.timeout_s, self.out_path)


def table(found: dict, topo: topology.Topology | None, expected: list[float] | None,
          peak: float | None) -> list[str]:
    """Every rank's multiply and every link, as measured, beside the cluster's figures."""
    lines = [f"preflight: {len(found['ranks'])} rank(s) on {len({h for _, h, _ in found['ranks']})} node(s), "
             f"{found['device']}, {found['bytes']} bytes x {found['iters']} ping-pongs per link"]
    for rank, host, f in found["ranks"]:
        of_peak = f" ({f / peak:.0%} of cluster.peak_flops)" if peak else ""
        lines.append(f"  rank {rank:>4} on {host:<12} multiply {f / 1e9:>10.3g} GFLOP/s{of_peak}")
    for a, b, rate in found["pairs"]:
        level = topo.lca_level({a, b}) if topo is not None and a != b else -1
        nominal = expected[level + 1] if expected and level + 1 < len(expected) else None
        beside = f" ({rate / nominal:.2f} of cluster.bandwidth_GBps's {nominal / GB:g} at level {level})" \
            if nominal else ""
        lines.append(f"  link {a} <-> {b}: {rate / GB:.4g} GB/s{beside}")
    return lines


def preflight(settings: Settings, runs: list | None = None) -> int:
    """Submit the preflight on the widest run's placement, wait, judge, print; 0 when nothing is slow."""
    cluster, scheduler = settings.cluster, schedulers.of(settings.cluster)
    scheduler.check_environment()
    topo, _, widest = widest_run(settings, runs)
    folder = settings.sweep_dir / "preflight"
    raw = folder / "raw.json"
    raw.unlink(missing_ok=True)
    request = settings.preflight
    nbytes = request.bytes or (64 << 20 if cluster.device == "cuda" else 1 << 20)
    job = PreflightJob(cluster.device, cluster.backend, list(widest.placement.hosts), nbytes, request.iters,
                       widest.run.spec.train.timeout_s, str(raw))
    started = time.monotonic()
    submitted = scheduler.submit_job(scheduler.executor(widest, folder / "submitit"), job, "the preflight",
                                     folder / "submitit")
    world = widest.run.spec.world_size
    print(f"preflight: job {submitted.job_id} on {world} ranks ({len(widest.placement.nodes)} nodes, placed like "
          f"{widest.run.run_id})", flush=True)
    scheduler.wait_for(submitted, world, settings.poll_s)
    if not raw.exists():
        raise SubmitError(f"the preflight job failed: {failure_reason(submitted, world)}")
    found = json.loads(raw.read_text())
    expected = cluster.bandwidth or None
    named = judge(found, topo, request.fraction)
    print("\n".join(table(found, topo, expected, cluster.peak_flops)))
    write_atomic(settings.sweep_dir / "preflight.json",
                 json.dumps({**found, "named": named, "exclude": excluded(named),
                             "seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
    if not named:
        print(f"preflight: nothing slow below {request.fraction:g} of its peers "
              f"({time.monotonic() - started:.0f} s)")
        return 0
    for line in named:
        print(f"preflight: SLOW {line}")
    nodes = excluded(named)
    print(f"preflight: leave them out with cluster.sbatch_extra.exclude={compress(nodes)} (sbatch --exclude) "
          f"({time.monotonic() - started:.0f} s)" if nodes else "preflight: a link is slow between nodes that are "
          "otherwise fine: tell the site")
    return 1
