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

from launcher.placement import allocate, topology
from launcher.slurm import hostlist
from train.contract.common import ConfigError
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
