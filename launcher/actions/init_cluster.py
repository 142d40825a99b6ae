"""action=init_cluster: a cluster file written from what scontrol says (live, or a snapshot of slurm/capture.sh),
so a new cluster is onboarded without guessing: GPUs per node and their model from Gres, CPUs and memory per node,
the GPU partition, the topology's shape, SLURM's ClusterName. The GPU model gives memory, fp8 and peak (the table of
launcher.slurm.hardware), and the topology one nominal bandwidth per level, so the plan it points to runs. What it
cannot infer it says, and leaves as the template has it.
`python -m launcher action=init_cluster init.name=NAME init.out=DIR [cluster.snapshot=SNAP]` writes
DIR/cluster/NAME.yaml; `--config-dir DIR cluster=NAME` then plans with it."""
from __future__ import annotations

import re
from dataclasses import replace
from datetime import date
from pathlib import Path

from launcher.placement import topology
from launcher.settings import CONF_DIR, Settings, check_name
from launcher.slurm import hardware, scontrol
from launcher.slurm.parse import Node, parse_partitions
from train.contract.common import ConfigError, write_atomic

# Nominal GB/s per GPU, one direction (action=probe measures): inside a node when the GPU model's NVLink is not
# known; then InfiniBand NDR (400 Gb/s = 50 GB/s per port, one port per GPU) halved under a leaf switch and halved
# again above it, as in conf/cluster/slurm.yaml
NOMINAL_NODE_GBPS = 240
NOMINAL_SCALE_OUT_GBPS = [25, 12.5]


def gpu_partition(nodes: list[Node], records: dict[str, dict]) -> tuple[str, str]:
    """(partition, why it was chosen): the one with the most GPU nodes, the site's default among equals."""
    by_partition = {p: members for p, members in hardware.partitions(nodes).items()
                    if any(n.gpus for n in members)}
    if not by_partition:
        raise ConfigError("no node of this cluster has GPUs in its Gres= (scontrol show node): fedshard's cluster "
                          "files describe GPU clusters (conf/cluster/testbed.yaml is a CPU one to copy by hand)")
    ranked = sorted(by_partition, key=lambda p: (-sum(n.gpus > 0 for n in by_partition[p]),
                                                 records.get(p, {}).get("Default") != "YES", p))
    why = "the only partition with GPU nodes" if len(ranked) == 1 else \
        f"most GPU nodes of {', '.join(ranked)}"
    return ranked[0], why


def nodes_per_level(topo: topology.Topology, members: list[str]) -> list[int]:
    """Nodes of the partition under one switch (or block) of each level of the tree the plan will read, from the
    largest such subtree: one entry per level, so cluster.bandwidth_GBps gets the values the plan asks for."""
    inside = set(members)
    below: dict[str, int] = {}
    for leaf, hosts in topo.leaves.items():
        count = len(inside.intersection(hosts))
        for switch in [leaf, *topo.ancestors(leaf)]:
            below[switch] = below.get(switch, 0) + count
    largest = {level: 0 for level in range(topo.top_level + 1)}
    for switch, count in below.items():
        largest[topo.level[switch]] = max(largest[topo.level[switch]], count)
    return [1] + [largest[level] for level in sorted(largest)]


def bandwidth(topo: topology.Topology, gpu: hardware.GpuModel | None) -> tuple[list[float], str]:
    """Nominal GB/s per level, as many as the tree has levels (inside a node, then each level): inside a node, and
    across a block of topology/block (an NVLink domain, as an NVL72 rack), the GPU model's NVLink; above, the scale
    out network's nominal figures. And where the first figure came from."""
    nvlink = gpu.nvlink_GBps if gpu is not None else None
    node = nvlink or NOMINAL_NODE_GBPS
    fast = [node, node] if topo.block_size is not None else [node]  # a block is one NVLink domain
    levels = topo.top_level + 2
    slow = [*NOMINAL_SCALE_OUT_GBPS, *[NOMINAL_SCALE_OUT_GBPS[-1]] * levels][:max(0, levels - len(fast))]
    source = "the GPU model's NVLink" if nvlink else "nominal, the GPU model's NVLink not being known"
    if topo.block_size is not None:
        source += " inside a node and across a block (one NVLink domain)"
    return [*fast, *slow][:levels], source


def cluster_yaml(settings: Settings, source: str) -> tuple[str, list[str], list[str]]:
    """(the file's text, what was read and from where, what could not be inferred)."""
    snapshot = settings.cluster.snapshot
    if snapshot is not None:
        snapshot = str(Path(snapshot).expanduser().resolve())
    nodes_text, default_text = scontrol.nodes_text(snapshot), scontrol.topology_text(snapshot)
    records = parse_partitions(scontrol.partitions_text(snapshot) or "")
    # a snapshot is checked whole, as the plan checks it
    whole = topology.build(default_text, nodes_text, (snapshot, "topology.txt") if snapshot else None)
    nodes = [node for node in whole.nodes.values() if node is not None]
    partition, why = gpu_partition(nodes, records)
    hw = hardware.of_partition(nodes, partition)
    gpus, gpu_counts = hw.gpus
    cpus, _ = hw.cpus
    memory, _ = hw.memory_mb
    model, model_source = hw.gpu_model
    known = hardware.known_gpu(model) if model else None
    key, gpu = known if known else (model, None)
    up = [n for n in hw.nodes if n.schedulable]
    usable = 1 << (len(up).bit_length() - 1) if up else 0  # a power of two: every paper layout's F and R divide it
    values = {"name": "null", "nodes": usable, "gpus_per_node": gpus, "partition": partition,
              "cpus_per_task": cpus // gpus if cpus else "null", "mem": f"{memory}M" if memory else "null",
              "snapshot": snapshot or "null"}
    down = f" ({len(hw.nodes) - len(up)} of {len(hw.nodes)} down or drained now)" if len(up) < len(hw.nodes) else ""
    read = [f"partition {partition} ({why}): nodes {usable}, the largest power of two of the {len(up)} up{down}",
            f"GPUs per node: {gpus} (Gres)" + (f"; the nodes differ: {gpu_counts}" if len(gpu_counts) > 1 else ""),
            f"CPUs per node: {cpus} (CPUTot) -> cpus_per_task {values['cpus_per_task']}",
            f"memory per node: {memory} MB (RealMemory) -> mem {values['mem']}"]
    unknown = []
    if model:
        read.append(f"GPU model: {model} ({model_source})" + (f", the {key} of launcher/slurm/hardware.py's table"
                                                             if gpu and key != model else ""))
    else:
        unknown.append(f"GPU model ({model_source}): set gpu_memory_GB, fp8 and peak_flops")
    if model and gpu is None:
        unknown.append(f"the GPU model {model} is not in launcher/slurm/hardware.py's table: set gpu_memory_GB, fp8 "
                       f"and peak_flops from its data sheet")
    memory_gb = hardware.gpu_memory(model, gpu) if gpu else None
    if memory_gb:
        values["gpu_memory_GB"] = f"{memory_gb:g}"
        read.append(f"gpu_memory_GB {memory_gb:g} (the {key}'s data sheet"
                    + (f"; {memory_gb:g} GB named by {model})" if gpu.memory_GB is None else ")"))
    elif gpu:
        unknown.append(f"gpu_memory_GB: the {key} is sold with several memory sizes "
                       f"({', '.join(f'{size} GB' for size in gpu.sizes)}) and the name {model} ({model_source}) "
                       f"gives none: set yours; until then the plan checks no layout against it")
    if gpu is not None and gpu.fp8 is not None:
        values["fp8"] = "true" if gpu.fp8 else "false"
        read.append(f"fp8 {values['fp8']} (the {key} has {'' if gpu.fp8 else 'no '}fp8 tensor cores: its data sheet)")
    elif gpu is not None:
        unknown.append(f"fp8: left to the job's own check on the {key}")
    if gpu is not None:
        values["peak_flops"] = f"{gpu.peak_flops:.3e}"  # 9.890e+14: a float to YAML 1.1 too (dot and signed exponent)
        read.append(f"peak_flops {gpu.peak_flops:.4g} (bf16 dense, the {key}'s data sheet)")
    limit = records.get(partition, {}).get("MaxTime", "")
    minutes = _minutes(limit)
    if minutes is not None and minutes < 60:
        values["time_min"] = minutes
        read.append(f"time_min {minutes} (the partition's MaxTime={limit})")
    # the tree the plan reads: the partition's named topology on SLURM >= 25.05, else the default one
    name = scontrol.topology_name(replace(settings.cluster, snapshot=snapshot, partition=partition,
                                          topology_name=None))
    text = default_text if name is None else scontrol.topology_text(snapshot, name)
    topo = whole if name is None else topology.build(text, nodes_text, (snapshot, scontrol.topology_file(name))
                                                     if snapshot else None)
    if text.strip():
        sizes = nodes_per_level(topo, [n.name for n in hw.nodes])
        values["nodes_per_level"] = f"[{', '.join(map(str, sizes))}]"
        shape = (f"topology/block, blocks of {topo.block_size} nodes" if topo.block_size is not None
                 else f"topology/tree with {topo.top_level + 1} switch level(s)")
        read.append(f"nodes_per_level {values['nodes_per_level']} ({shape}"
                    + (f", topology {name} of partition {partition})" if name else ")"))
        nominal, origin = bandwidth(topo, gpu)
        values["bandwidth_GBps"] = f"[{', '.join(f'{b:g}' for b in nominal)}]"
        read.append(f"bandwidth_GBps {values['bandwidth_GBps']}: one per level, {origin}")
    else:
        unknown.append("topology: no topology plugin: SLURM sees the nodes as one flat switch")
    cluster = scontrol.cluster_name() if snapshot is None else scontrol.snapshot_cluster_name(snapshot)
    if cluster:
        values["slurm_name"] = cluster
        read.append(f"slurm_name {cluster} (ClusterName)")
    else:
        unknown.append("slurm_name: the snapshot has no config.txt (slurm/capture.sh captures it): set it to "
                       "`scontrol show config | grep ClusterName` for cluster.topology=auto to read it live")
    if not records:
        unknown.append("partition limits: the snapshot has no partitions.txt (time_min stays 60)")
    unknown += ["bandwidth_GBps: nominal values (NVLink where the GPU model is known, then InfiniBand NDR halved per "
                "switch level), not measured here: run action=probe on the cluster",
                "account, qos: set yours (sacctmgr show assoc user=$USER)"]
    text = (CONF_DIR / "cluster" / "slurm.yaml").read_text()
    for key_, value in values.items():
        text, n = re.subn(rf"(?m)^{key_}:[^\n#]*?(\s*#|\n|$)", lambda m, v=value, k=key_: f"{k}: {v}{m.group(1)}",
                          text, count=1)
        if not n:
            raise ConfigError(f"conf/cluster/slurm.yaml has no {key_}: line to fill in")
    header = "".join(f"#   {line}\n" for line in read) + "".join(f"#   NOT INFERRED: {line}\n" for line in unknown)
    text = re.sub(r"\A(#[^\n]*\n)+", lambda _: f"# Written by `python -m launcher action=init_cluster` from {source} "
                  f"on {date.today().isoformat()}.\n{header}", text, count=1)
    return text, read, unknown


def _minutes(limit: str) -> int | None:
    """SLURM's MaxTime ([days-]hours:minutes:seconds, or minutes) in minutes; None when UNLIMITED or absent."""
    found = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", limit)
    if found:
        d, h, m, _ = (int(x or 0) for x in found.groups())
        return d * 1440 + h * 60 + m
    return int(limit) if limit.isdigit() else None


def init_cluster(settings: Settings) -> int:
    """Write init.out/cluster/init.name.yaml (never over an existing file) and say what to check in it."""
    init = settings.init
    if not init.name or not init.out:
        raise ConfigError("action=init_cluster needs init.name=NAME (the cluster's name) and init.out=DIR "
                          "(where DIR/cluster/NAME.yaml goes; then --config-dir DIR cluster=NAME)")
    out = Path(init.out).expanduser().resolve()
    blocked = next((p for p in (out / "cluster", *(out / "cluster").parents) if p.exists()), out)
    if not blocked.is_dir():
        raise ConfigError(f"init.out={init.out}: {blocked} is a file, not a directory: init.out names the directory "
                          f"DIR that gets DIR/cluster/{init.name}.yaml (then --config-dir DIR cluster={init.name})")
    path = check_name(init.name, out / "cluster", "init.name").with_suffix(".yaml")
    if path.exists():
        raise ConfigError(f"{path} exists: delete it or choose another init.name (it is never overwritten)")
    source = f"snapshot {settings.cluster.snapshot}" if settings.cluster.snapshot else "live scontrol"
    text, read, unknown = cluster_yaml(settings, source)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"init.out={init.out}: cannot create {path.parent}: {exc.strerror or exc}") from None
    write_atomic(path, text)
    print(f"wrote {path} from {source}:")
    for line in read:
        print(f"  {line}")
    for line in unknown:
        print(f"  not inferred: {line}")
    print(f"next: python -m launcher --config-dir {out} cluster={init.name} sweep=paper_table3 action=plan")
    return 0
