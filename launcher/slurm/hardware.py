"""What the nodes of a partition have, read from scontrol's node records: GPUs and their model (Gres), CPUs,
memory. The one place both action=init_cluster (which writes a cluster file from it) and the plan (which checks a
cluster file against it) read it from."""
from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass

from launcher.slurm.parse import Node
from train.contract.common import ConfigError


@dataclass(frozen=True)
class GpuModel:
    """What a GPU model's data sheet says, per GPU (SXM parts where there are several)."""

    memory_GB: float | None      # None: sold in several sizes (`sizes`); the Gres type may name one (a100_80gb)
    peak_flops: float            # dense bf16 (fp16 on the V100, which has no bf16), FLOP/s
    fp8: bool | None             # fp8 tensor cores (cluster.fp8; None: left to the job's own check)
    nvlink_GBps: float | None    # NVLink per GPU, one direction: half the data sheet's both-direction figure
    sizes: tuple[int, ...] = ()  # the memory sizes it is sold in, when several


# GPU models a Gres type or a node feature may name, from the vendors' data sheets:
GPU_MODELS = {
    # NVIDIA Tesla V100 data sheet: 16 or 32 GB HBM2, 125 TFLOPS tensor (fp16), NVLink 300 GB/s; no fp8
    "v100": GpuModel(None, 125e12, False, 150, (16, 32)),
    # NVIDIA A100 data sheet: 40 GB HBM2 or 80 GB HBM2e, BF16 312 TFLOPS dense (624 sparse), NVLink 600 GB/s;
    # no fp8 (Ampere's tensor cores stop at fp16/bf16, int8)
    "a100": GpuModel(None, 312e12, False, 300, (40, 80)),
    # NVIDIA H100 data sheet (SXM): 80 GB, BF16 1,979 TFLOPS with sparsity (989 dense), FP8, NVLink 900 GB/s
    "h100": GpuModel(80, 989e12, True, 450),
    # NVIDIA H200 data sheet (SXM): 141 GB HBM3e, BF16 1,979 TFLOPS with sparsity, FP8, NVLink 900 GB/s
    "h200": GpuModel(141, 989e12, True, 450),
    # NVIDIA GH200 data sheet: 96 GB HBM3 or 144 GB HBM3e, an H100-class GPU (BF16 989 dense, FP8); its NVLink-C2C
    # (900 GB/s) joins the GPU to its CPU, so the GPUs' own links are the site's
    "gh200": GpuModel(None, 989e12, True, None, (96, 144)),
    # NVIDIA HGX B200 specifications: 1.4 TB HBM3e for 8 GPUs (180 GB each), BF16 36 PFLOPS with sparsity for 8
    # (2.25 dense each), FP8, NVLink 5 1.8 TB/s per GPU
    "b200": GpuModel(180, 2250e12, True, 900),
    # NVIDIA GB200 NVL72 specifications: 13.4 TB HBM3e for 72 GPUs (186 GB each), BF16 5 PFLOPS per GPU with
    # sparsity (2.5 dense), FP8, NVLink 5 1.8 TB/s per GPU across the rack's 72 (conf/cluster/nvl72.yaml)
    "gb200": GpuModel(186, 2500e12, True, 900),
    # NVIDIA L40S data sheet: 48 GB GDDR6, BF16 362 TFLOPS dense (733 sparse), FP8; no NVLink
    "l40s": GpuModel(48, 362e12, True, None),
    # AMD Instinct MI250X / MI250 data sheets: 128 GB HBM2e, BF16 383 / 362 TFLOPS; no fp8
    "mi250x": GpuModel(128, 383e12, False, None),
    "mi250": GpuModel(128, 362e12, False, None),
    # AMD Instinct MI300X data sheet: 192 GB HBM3, BF16 1,307 TFLOPS dense; its fp8 (e4m3fnuz) is left to the job
    "mi300x": GpuModel(192, 1307e12, None, None),
}
_VENDOR = re.compile(r"^(nvidia|tesla|amd|instinct)[-_ ]+")


@functools.lru_cache(maxsize=256)  # a cluster's nodes share a few names, asked once per node
def known_gpu(name: str) -> tuple[str, GpuModel] | None:
    """(table key, model) of a GPU named as a Gres type or a node feature names it: `a100`, `A100-SXM4-80GB`,
    `nvidia_h100_80gb_hbm3`, `gb200`; the longest key the name starts with, followed by nothing or a separator
    (so gh200 is not h200, nor a1000 an a100)."""
    name = _VENDOR.sub("", name.strip().lower())
    for key in sorted(GPU_MODELS, key=len, reverse=True):
        if re.match(rf"{key}(?![0-9a-z])", name):
            return key, GPU_MODELS[key]
    return None


def gpu_memory(name: str, model: GpuModel) -> float | None:
    """GB per GPU: the data sheet's, or for a model sold in several sizes the one its name gives (a100-sxm4-80gb:
    80; a size the model is not sold in, such as gh200_480gb's CPU and GPU memory together, is not taken)."""
    if model.memory_GB is not None:
        return model.memory_GB
    sizes = [int(size) for size in re.findall(r"(?<![0-9])(\d+)g(?:b)?(?![0-9a-z])", name.lower())]
    return next((size for size in reversed(sizes) if size in model.sizes), None)


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
                                         if known_gpu(f)), None) for n in self.nodes)
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
