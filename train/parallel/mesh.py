"""The one device mesh (fed, replicate, shard, pp, tp); every process group comes from it.

Rank k sits at coordinate (f, r, s, p, t) in row-major order (train.contract.layout), so placement is done by choosing
which host runs which rank, never by permuting the mesh (a mesh built from a permuted rank array silently
breaks DTensor offsets). Dimensions of size 1 are kept, so every sub-mesh exists whatever the layout.
"""
from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from train.contract.layout import NAMES, STRATEGIES, Layout


def build(device_type: str, layout: Layout) -> DeviceMesh:
    return init_device_mesh(device_type, layout.shape, mesh_dim_names=NAMES)


def build_group(device_type: str, layout: Layout) -> DeviceMesh:
    """One federation group's mesh, for a group that is its own world (train.fault_tolerance=groups): the run's
    dimensions with fed of size 1, so everything but the exchange across groups is built as in the whole run."""
    return init_device_mesh(device_type, (1, *layout.shape[1:]), mesh_dim_names=NAMES)


def data_parallel_mesh(mesh: DeviceMesh, strategy: str) -> DeviceMesh:
    """The mesh fully_shard uses: 1-D shard for FSDP-like, 2-D replicate x shard for HSDP-like."""
    dims = STRATEGIES[strategy].mesh_dims
    return mesh[dims] if len(dims) > 1 else mesh[dims[0]]
