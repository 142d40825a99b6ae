"""The one device mesh (fed, replicate, shard); every process group comes from it.

Rank k sits at coordinate (f, r, s) in row-major order, so placement is done by
choosing which host runs which rank, never by permuting the mesh (a mesh built
from a permuted rank array silently breaks DTensor offsets).
"""
from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .spec import coords  # noqa: F401  (re-exported: rank -> (f, r, s))

DIMS = ("fed", "replicate", "shard")


def build(device_type: str, F: int, R: int, S: int) -> DeviceMesh:
    return init_device_mesh(device_type, (F, R, S), mesh_dim_names=DIMS)


def data_parallel_mesh(mesh: DeviceMesh, strategy: str) -> DeviceMesh:
    """The mesh fully_shard uses: 1-D shard for FSDP-like, 2-D replicate x shard for HSDP-like."""
    if strategy in ("hsdp", "fl_hsdp"):
        return mesh["replicate", "shard"]
    return mesh["shard"]
