"""What the nodes of a partition have, read from scontrol's node records: GPUs and their model (Gres), CPUs,
memory. The one place both action=init_cluster (which writes a cluster file from it) and the plan (which checks a
cluster file against it) read it from."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from launcher.slurm.parse import Node
from train.contract.common import ConfigError

# GPU models a Gres type or a node feature may name: memory per GPU in GB (None: sold in several sizes) and
# dense bf16 peak FLOP/s per GPU (the vendors' data sheets; SXM parts)
GPU_MODELS = {
    "v100": (None, 125e12), "a100": (None, 312e12), "h100": (80, 989e12), "h200": (141, 989e12),
    "gh200": (96, 989e12), "b200": (180, 2250e12), "gb200": (186, 2500e12), "mi250": (None, 383e12),
    "mi300x": (192, 1307e12),
}


@dataclass
class Hardware:
    """The nodes of one partition, and what most of them have (a partition may mix node kinds)."""

    partition: str
    nodes: list[Node]

    def _common(self, values) -> tuple[int | None, dict]:
        counts = Counter(v for v in values if v is not None)
        return (counts.most_common(1)[0][0] if counts else None), dict(counts)

    @property
    def gpus(self) -> tuple[int | None, dict]:
        """(GPUs per node on most nodes, {count: nodes})."""
        return self._common(n.gpus for n in self.nodes)

    @property
    def cpus(self) -> tuple[int | None, dict]:
        return self._common(_number(n.fields.get("CPUTot")) for n in self.nodes)

    @property
    def memory_mb(self) -> tuple[int | None, dict]:
        """RealMemory= (MB): what SLURM lets jobs ask for on a node."""
        return self._common(_number(n.fields.get("RealMemory")) for n in self.nodes)

    @property
    def gpu_model(self) -> tuple[str | None, str]:
        """(model, where it was read: the Gres type or a node feature); (None, why) when neither names one."""
        model, _ = self._common(_gres_type(n.fields.get("Gres", "")) for n in self.nodes)
        if model:
            return model, "Gres type"
        features, _ = self._common(next((f for f in n.fields.get("AvailableFeatures", "").lower().split(",")
                                         if f in GPU_MODELS), None) for n in self.nodes)
        if features:
            return features, "node feature"
        return None, "Gres names no GPU type and no node feature names a known GPU"


def _number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _gres_type(gres: str) -> str | None:
    """h100 of gpu:h100:8(S:0-1); None for gpu:8."""
    for item in re.split(r",(?![^(]*\))", gres):
        parts = re.sub(r"\(.*\)$", "", item).split(":")
        if parts[0] == "gpu" and len(parts) == 3:
            return parts[1].lower()
    return None


def partitions(nodes: list[Node]) -> dict[str, list[Node]]:
    """Partition -> its nodes, from each node's Partitions= (no partition listing is needed for this)."""
    out: dict[str, list[Node]] = {}
    for node in nodes:
        for name in node.partitions:
            out.setdefault(name, []).append(node)
    return out


def of_partition(nodes: list[Node], partition: str) -> Hardware:
    """The partition's nodes; a partition no node belongs to is one ConfigError naming those that exist."""
    known = partitions(nodes)
    if str(partition) not in known:
        raise ConfigError(f"partition {partition!r} does not exist on this cluster (scontrol's nodes are in "
                          f"{', '.join(sorted(known)) or 'no partition'}): set cluster.partition")
    return Hardware(str(partition), known[str(partition)])


def check(cluster, nodes: list[Node]) -> None:
    """Refuse, in one line, a cluster file that does not match what scontrol says of its partition: a copied
    template planning 4 GPUs on 8-GPU nodes, more CPUs or memory per node than a node has, a partition that is
    not there."""
    if not nodes or not cluster.partition:
        return
    hw = of_partition(nodes, cluster.partition)
    gpus, counts = hw.gpus
    if cluster.device == "cuda" and gpus is not None and gpus != cluster.gpus_per_node:
        mixed = f" ({', '.join(f'{c} node(s) with {g}' for g, c in sorted(counts.items()))})" if len(counts) > 1 else ""
        raise ConfigError(f"cluster.gpus_per_node={cluster.gpus_per_node} but the nodes of partition "
                          f"{hw.partition} have {gpus} GPUs{mixed} (scontrol's Gres): set cluster.gpus_per_node="
                          f"{gpus}, or regenerate the file with action=init_cluster")
    cpus, _ = hw.cpus
    wanted = cluster.gpus_per_node * (cluster.cpus_per_task or 1)
    if cpus is not None and wanted > cpus:
        raise ConfigError(f"cluster.cpus_per_task={cluster.cpus_per_task} x {cluster.gpus_per_node} tasks = {wanted} "
                          f"CPUs per node, but the nodes of partition {hw.partition} have {cpus} (CPUTot): set "
                          f"cluster.cpus_per_task={max(1, cpus // cluster.gpus_per_node)}")
    memory, _ = hw.memory_mb
    if memory is not None and cluster.mem not in (None, 0, "0") and mem_mb(cluster.mem) > memory:
        raise ConfigError(f"cluster.mem={cluster.mem} per node, but the nodes of partition {hw.partition} have "
                          f"{memory}M (RealMemory): set cluster.mem={memory}M, or 0 for all of it")


def mem_mb(mem) -> float:
    """sbatch's --mem in MB: 480G -> 491520 (a bare number is MB, as sbatch reads it)."""
    number, unit = re.fullmatch(r"(\d+)([KMGT]?)", str(mem)).groups()
    return int(number) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 ** 2}[unit]
