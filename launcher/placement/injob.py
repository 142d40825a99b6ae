"""In-job placement: SLURM's allocation is not deterministic, so the rank order is chosen at job start.

Every task reads the nodes it was given (SLURM_JOB_NODELIST), places the layout on them with
the topology the launcher saved at submission, and takes as its rank the position of its own
(node, local id) in that placement — before any process group exists, so rank 0 (and the
rendezvous) lands where the placement put it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.placement import allocate, health, topology
from launcher.slurm import hostlist
from train.contract.common import ConfigError, PreflightError, write_atomic
from train.contract.spec import RunSpec
from train.job import TrainJob


def placed_rank(spec: RunSpec, topo: topology.Topology, G: int, environ=os.environ) -> int:
    allocated = hostlist.expand(environ["SLURM_JOB_NODELIST"])
    unknown = [n for n in allocated if n not in topo.parent]
    if unknown:
        raise ConfigError(f"allocated node(s) {', '.join(unknown[:3])} are not in the saved topology")
    placement = allocate.place(spec.layout, G, topo, usable=allocated)
    me, local = environ["SLURMD_NODENAME"], int(environ["SLURM_LOCALID"])
    mine = [rank for rank, host in enumerate(placement.hosts) if host == me]
    if local >= len(mine):
        raise ConfigError(f"task {local} on {me} has no slot in the placement ({len(mine)} ranks there)")
    return mine[local]


class PlacedTrainJob(TrainJob):
    """The training entrypoint with ranks reordered by topology at job start (picklable for submitit)."""

    def __init__(self, spec_path: str, topology_path: str, gpus_per_node: int):
        super().__init__(spec_path)
        self.topology_path, self.gpus_per_node = str(topology_path), gpus_per_node

    def __call__(self):
        spec = RunSpec.load(self.spec_path)
        topo = topology.from_json(json.loads(Path(self.topology_path).read_text()))
        os.environ["FEDSHARD_RANK"] = str(placed_rank(spec, topo, self.gpus_per_node))
        return super().__call__()


class PreflightedJob:
    """A run's job that first checks the nodes it got (cluster.preflight: train.job.preflight, judged by
    launcher.placement.health): nothing slow, it trains; else every task ends with one line naming what is slow,
    and rank 0 leaves <run dir>/preflight.json, whose nodes the launcher leaves out when it retries the run."""

    def __init__(self, job: TrainJob, topology_path: str, hosts: list[str], cluster_device: str, backend: str,
                 request: tuple[int, int, float]):
        """`request`: the message bytes, timed iterations and the fraction of its peers a rank or link must reach
        (settings' preflight section)."""
        self.job, self.topology_path, self.hosts = job, str(topology_path), list(hosts)
        self.device, self.backend, self.request = cluster_device, backend, request
        self.PRELOAD = (*job.PRELOAD, "train.job.preflight")

    def checkpoint(self, *args, **kwargs):
        """submitit's requeue on pre-emption: this same job again."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)

    def __call__(self):
        from train.job.preflight import check  # the job's side: torch only where ranks run

        spec = RunSpec.load(self.job.spec_path)
        run_dir = Path(spec.out_dir)
        nbytes, iters, fraction = self.request
        found = check(self.device, self.backend, self.hosts, nbytes, iters, spec.train.timeout_s, run_dir)
        topo = topology.from_json(json.loads(Path(self.topology_path).read_text()))
        named = health.judge(found, topo, fraction)
        if named:
            leave_out = health.excluded(named)
            if found["rank"] == 0:
                write_atomic(run_dir / health.FILE, json.dumps({"named": named, "exclude": leave_out}) + "\n")
            raise PreflightError(f"preflight: {named[0]}" + (f" ({len(named) - 1} more)" if len(named) > 1 else "")
                                 + (f"; the launcher retries without {', '.join(leave_out)}" if leave_out else ""))
        return self.job()
