"""action=init_cluster: a cluster file written from what scontrol says (live, or a snapshot of slurm/capture.sh),
so a new cluster is onboarded without guessing: GPUs per node and their model from Gres, CPUs and memory per node,
the GPU partition, the topology's shape, SLURM's ClusterName. What it cannot infer it says, and leaves as the
template has it. `python -m launcher action=init_cluster init.name=NAME init.out=DIR [cluster.snapshot=SNAP]`
writes DIR/cluster/NAME.yaml; `--config-dir DIR cluster=NAME` then plans with it."""
from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from launcher.settings import CONF_DIR, Settings, check_name
from launcher.slurm import hardware, scontrol
from launcher.slurm.parse import Node, Switch, parse_nodes, parse_partitions, parse_topology
from train.contract.common import ConfigError, write_atomic

NOMINAL_GBPS = [240, 25, 12.5]  # per GPU: inside a node, under a leaf, above it (the template's; action=probe measures)


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


def nodes_per_level(topology_text: str, members: list[str]) -> tuple[list[int] | None, str]:
    """Nodes under one switch (or block) of each level, from the largest such subtree holding partition nodes."""
    items = parse_topology(topology_text)
    if not items:
        return None, "no topology plugin: SLURM sees the nodes as one flat switch"
    inside = set(members)
    if not isinstance(items[0], Switch):  # blocks: a base block, then the whole partition
        base = min(len(b.nodes) for b in items if not b.aggregated)
        return [1, base, max(base, len(inside))], f"topology/block, blocks of {base} nodes"
    levels: dict[int, int] = {}
    for switch in items:
        below = len(inside & set(switch.nodes))
        levels[switch.level] = max(levels.get(switch.level, 0), below)
    sizes = [1] + [levels[lv] for lv in sorted(levels)]
    return sizes, f"topology/tree with {len(levels)} switch level(s)"


def cluster_yaml(settings: Settings, source: str) -> tuple[str, list[str], list[str]]:
    """(the file's text, what was read and from where, what could not be inferred)."""
    snapshot = settings.cluster.snapshot
    if snapshot is not None:
        snapshot = str(Path(snapshot).expanduser().resolve())
    nodes = parse_nodes(scontrol.nodes_text(snapshot))
    records = parse_partitions(scontrol.partitions_text(snapshot) or "")
    partition, why = gpu_partition(nodes, records)
    hw = hardware.of_partition(nodes, partition)
    gpus, gpu_counts = hw.gpus
    cpus, _ = hw.cpus
    memory, _ = hw.memory_mb
    model, model_source = hw.gpu_model
    memory_gb, peak = hardware.GPU_MODELS.get(model, (None, None)) if model else (None, None)
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
        read.append(f"GPU model: {model} ({model_source})")
    else:
        unknown.append(f"GPU model ({model_source}): set gpu_memory_GB and peak_flops")
    if memory_gb:
        values["gpu_memory_GB"] = memory_gb
        read.append(f"gpu_memory_GB {memory_gb} (the {model}'s data sheet)")
    elif model:
        unknown.append(f"gpu_memory_GB: the {model} is sold with several memory sizes")
    if peak:
        values["peak_flops"] = f"{peak:.3e}"  # 9.890e+14: a float to YAML 1.1 too (dot and signed exponent)
        read.append(f"peak_flops {peak:.4g} (bf16 dense, the {model}'s data sheet)")
    limit = records.get(partition, {}).get("MaxTime", "")
    minutes = _minutes(limit)
    if minutes is not None and minutes < 60:
        values["time_min"] = minutes
        read.append(f"time_min {minutes} (the partition's MaxTime={limit})")
    sizes, shape = nodes_per_level(scontrol.topology_text(snapshot), [n.name for n in hw.nodes])
    if sizes:
        values["nodes_per_level"] = f"[{', '.join(map(str, sizes))}]"
        read.append(f"nodes_per_level {values['nodes_per_level']} ({shape})")
        nominal = [*NOMINAL_GBPS[:len(sizes)], *[NOMINAL_GBPS[-1]] * (len(sizes) - len(NOMINAL_GBPS))]
        values["bandwidth_GBps"] = f"[{', '.join(f'{b:g}' for b in nominal)}]"
    else:
        unknown.append(f"topology: {shape}")
    name = scontrol.cluster_name() if snapshot is None else scontrol.snapshot_cluster_name(snapshot)
    if name:
        values["slurm_name"] = name
        read.append(f"slurm_name {name} (ClusterName)")
    else:
        unknown.append("slurm_name: the snapshot has no config.txt (slurm/capture.sh captures it): set it to "
                       "`scontrol show config | grep ClusterName` for cluster.topology=auto to read it live")
    if not records:
        unknown.append("partition limits: the snapshot has no partitions.txt (time_min stays 60)")
    unknown += ["bandwidth_GBps: nominal values (NVLink, then InfiniBand NDR halved per switch level), not measured "
                "here: run action=probe on the cluster",
                "account, qos: set yours (sacctmgr show assoc user=$USER)"]
    text = (CONF_DIR / "cluster" / "slurm.yaml").read_text()
    for key, value in values.items():
        text, n = re.subn(rf"(?m)^{key}:[^\n#]*?(\s*#|\n|$)", lambda m, v=value: f"{key}: {v}{m.group(1)}", text,
                          count=1)
        if not n:
            raise ConfigError(f"conf/cluster/slurm.yaml has no {key}: line to fill in")
    header = "".join(f"#   {line}\n" for line in read) + "".join(f"#   NOT INFERRED: {line}\n" for line in unknown)
    text = re.sub(r"\A(#[^\n]*\n)+", f"# Written by `python -m launcher action=init_cluster` from {source} on "
                                    f"{date.today().isoformat()}.\n{header}", text, count=1)
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
    path = check_name(init.name, out / "cluster", "init.name").with_suffix(".yaml")
    if path.exists():
        raise ConfigError(f"{path} exists: delete it or choose another init.name (it is never overwritten)")
    source = f"snapshot {settings.cluster.snapshot}" if settings.cluster.snapshot else "live scontrol"
    text, read, unknown = cluster_yaml(settings, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    print(f"wrote {path} from {source}:")
    for line in read:
        print(f"  {line}")
    for line in unknown:
        print(f"  not inferred: {line}")
    print(f"next: python -m launcher --config-dir {out} cluster={init.name} sweep=paper_table3 action=plan")
    return 0
