"""What a SLURM job takes from the machine that submits it, said in the plan before anything is submitted: the
interpreter its tasks run (by absolute path, so it must exist on the nodes) and a results_dir the nodes share
(rank 0 publishes its address there, every rank writes its logs, the launcher reads result.json back)."""
from __future__ import annotations

import sys
from pathlib import Path

# filesystems the nodes of a cluster share; anything else (ext4, xfs, tmpfs, overlay) is most likely one machine's
SHARED = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs", "wekafs",
          "fuse.beegfs", "panfs", "fuse.sshfs", "9p", "virtiofs", "cifs", "smb3")


def filesystem(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding `path` (the longest mount point above it in /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text() if mounts is None else mounts
    except OSError:
        return None
    best, kind = "", None
    path_text = str(path)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path_text == point or path_text.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def lines(cluster, results_dir: Path, mounts: str | None = None) -> list[str]:
    """The plan's words on the job's interpreter and on results_dir's filesystem (a warning when node-local)."""
    python = cluster.python or sys.executable
    out = [f"job python: {python} ({'cluster.python' if cluster.python else 'this interpreter, sys.executable'}): "
           f"every node must have it at this path (a venv on a filesystem the nodes share; cluster.python=PATH "
           f"names another)"]
    kind = filesystem(results_dir, mounts)
    if kind is None or kind in SHARED:
        out.append(f"results_dir: {results_dir} ({kind or 'filesystem unknown'})")
    else:
        out.append(f"WARNING: results_dir {results_dir} is on {kind}, which is most likely this machine's alone: the "
                   f"nodes must share it (rank 0 publishes its address there): set results_dir=/a/shared/path")
    return out
