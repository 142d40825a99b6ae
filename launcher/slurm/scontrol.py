"""The one place that runs `scontrol` and `squeue`: topology and node texts (live, or from a snapshot
directory of topology.txt and nodes.txt; on SLURM >= 25.05 also topoconf.yaml, topology-NAME.txt and
partitions.txt), the named topology to use, job states, the cluster's name, whether accounting answers.
Their text is parsed by launcher.slurm.parse."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from launcher.slurm.hostlist import compress, expand
from launcher.slurm.parse import Node, parse_key_values, parse_nodes, parse_partitions
from train.contract.common import ConfigError, SlurmError


def run_scontrol(args: list[str], timeout_s: float = 30) -> str:
    """stdout of `scontrol ARGS`; failures become one-line SlurmErrors."""
    cmd = ["scontrol", *args]
    # SLURM_TOPO_LEN truncates topology lines, which could silently cut a Nodes= hostlist at a comma.
    env = {k: v for k, v in os.environ.items() if k != "SLURM_TOPO_LEN"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except FileNotFoundError:
        raise SlurmError("scontrol not found on PATH (run on a SLURM login node, or use a snapshot directory "
                          "holding topology.txt and nodes.txt)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(cmd)} did not answer within {timeout_s}s") from None
    if proc.returncode != 0:
        first = next((line.strip() for line in proc.stderr.splitlines() if line.strip()), "no message")
        raise SlurmError(f"{' '.join(cmd)} failed with exit code {proc.returncode}: {first}")
    return proc.stdout


def job_states(job_ids: list[str], timeout_s: float = 20) -> dict[str, str | None]:
    """The states of many jobs from one squeue call (so polling a sweep asks SLURM once, not once per run);
    a job squeue no longer lists is asked of `scontrol show job`; None when SLURM no longer knows it.

    submitit asks only sacct, which clusters without accounting lack.
    """
    states: dict[str, str | None] = {}
    if job_ids and shutil.which("squeue"):
        try:
            out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"], capture_output=True,
                                 text=True, timeout=timeout_s).stdout
            states = {fields[0]: fields[1] for fields in map(str.split, out.splitlines()) if len(fields) == 2}
        except subprocess.TimeoutExpired:
            pass
    return {job_id: states[job_id] if job_id in states else _shown_job_state(job_id, timeout_s)
            for job_id in job_ids}


def _shown_job_state(job_id: str, timeout_s: float) -> str | None:
    try:
        fields = parse_key_values(run_scontrol(["-o", "show", "job", job_id], timeout_s))
    except SlurmError:  # unknown job id, or scontrol missing / not answering
        return None
    return fields.get("JobState")


def job_nodes(job_id: str) -> list[str]:
    """The nodes a job holds now (`scontrol show job` NodeList), [] when it holds none or SLURM forgot it."""
    try:
        fields = parse_key_values(run_scontrol(["-o", "show", "job", job_id]))
    except SlurmError:
        return []
    listed = fields.get("NodeList", "")
    return expand(listed) if listed and listed != "(null)" else []


def lost_nodes(nodes: list[str]) -> list[str]:
    """Those of `nodes` that SLURM now has down, drained or failing: work on them ended, and none is placed
    there until an administrator resumes them."""
    try:
        live = {node.name: node for node in parse_nodes(run_scontrol(["-o", "show", "node", compress(nodes)]))}
    except SlurmError:
        return []
    return [n for n in nodes if n in live and not live[n].schedulable]


def cluster_name() -> str | None:
    """ClusterName of the SLURM controller this machine's scontrol talks to."""
    found = re.search(r"^ClusterName\s*=\s*(\S+)", run_scontrol(["show", "config"]), re.M)
    return found.group(1) if found else None


def accounting_enabled() -> bool:
    """Whether sacct can answer: without slurmdbd it only prints 'accounting storage is disabled'."""
    try:
        config = run_scontrol(["show", "config"])
    except SlurmError:
        return False
    return not re.search(r"^AccountingStorageType\s*=\s*accounting_storage/none", config, re.M)


NAMED_TOPOLOGIES = (25, 5)  # from SLURM 25.05 a cluster may hold several topologies (topology.yaml), and a bare
# argument to `scontrol show topology` is a topology's name; before, it was a node list


def version() -> tuple[int, int]:
    """(major, minor) of this machine's scontrol, from `scontrol --version` (`slurm 25.11.7`)."""
    out = run_scontrol(["--version"])
    found = re.search(r"(\d+)\.(\d+)", out)
    if not found:
        raise SlurmError(f"scontrol --version printed no version: {out.strip()[:80]!r}")
    return int(found.group(1)), int(found.group(2))


def topology_text(snapshot: str | None, name: str | None = None) -> str:
    """`scontrol show topology [NAME]` (a name only on SLURM >= 25.05: topology_name), or topology.txt
    (topology-NAME.txt) of a snapshot directory."""
    if snapshot is not None:
        return _snapshot_file(snapshot, topology_file(name))
    return run_scontrol(["show", "topology", *([name] if name else [])])


def topology_file(name: str | None) -> str:
    """A snapshot's file of the topology `name` (None: the default one)."""
    return "topology.txt" if name is None else f"topology-{name}.txt"


def topology_name(cluster) -> str | None:
    """The named topology (SLURM >= 25.05) to plan on: cluster.topology_name, else the one cluster.partition
    uses (its Topology=), else None (the cluster's default; on older SLURM the only one). A name this
    cluster's topology.yaml lacks is one ConfigError listing those it has."""
    snapshot = cluster.snapshot
    release = version() if snapshot is None else None
    if release is not None and release < NAMED_TOPOLOGIES:
        if cluster.topology_name:
            raise ConfigError(f"cluster.topology_name={cluster.topology_name} needs SLURM >= 25.05 (several named "
                              f"topologies); this scontrol is {'.'.join(map(str, release))}")
        return None
    if snapshot is not None and not snapshot_path(snapshot, "topoconf.yaml").is_file():
        if cluster.topology_name:
            raise ConfigError(f"cluster.topology_name={cluster.topology_name}: snapshot {snapshot} has no "
                              f"topoconf.yaml (capture on SLURM >= 25.05 with slurm/capture.sh)")
        return None
    names, default = topology_names(run_scontrol(["show", "topoconf"]) if snapshot is None
                                    else _snapshot_file(snapshot, "topoconf.yaml"))
    name = cluster.topology_name or _partition_topology(cluster.partition, snapshot)
    if name is not None and name not in names:
        source = "cluster.topology_name" if cluster.topology_name else f"Topology= of partition {cluster.partition}"
        raise ConfigError(f"unknown topology {name!r} ({source}): this cluster has {', '.join(names)}")
    return None if name == default else name


def topology_names(yaml_text: str) -> tuple[list[str], str | None]:
    """(every topology's name, the cluster default's) from `scontrol show topoconf` (topology.yaml)."""
    import yaml

    try:
        entries = yaml.safe_load(yaml_text) or []
        names = [e["topology"] for e in entries]
    except (yaml.YAMLError, TypeError, KeyError) as e:
        raise ConfigError(f"scontrol show topoconf is not a list of topologies: {e}") from None
    return names, next((e["topology"] for e in entries if e.get("cluster_default")), None)


def partitions_text(snapshot: str | None) -> str | None:
    """`scontrol -o show partition`, or partitions.txt of a snapshot directory (None when it has none)."""
    if snapshot is not None and not snapshot_path(snapshot, "partitions.txt").is_file():
        return None
    return run_scontrol(["-o", "show", "partition"]) if snapshot is None else _snapshot_file(snapshot, "partitions.txt")


def snapshot_cluster_name(snapshot: str) -> str | None:
    """ClusterName from config.txt (`scontrol show config`) of a snapshot directory, when it was captured."""
    text = _snapshot_file(snapshot, "config.txt") if snapshot_path(snapshot, "config.txt").is_file() else ""
    found = re.search(r"^ClusterName\s*=\s*(\S+)", text, re.M)
    return found.group(1) if found else None


def _partition_topology(partition, snapshot: str | None) -> str | None:
    """Topology= of the partition (SLURM >= 25.05), from `scontrol -o show partition` or partitions.txt."""
    if not partition:
        return None
    return parse_partitions(partitions_text(snapshot) or "").get(str(partition), {}).get("Topology")


def nodes_text(snapshot: str | None) -> str:
    """`scontrol -d -o show node` (-d: GresUsed, the GPUs in use), or nodes.txt of a snapshot directory."""
    return run_scontrol(["-d", "-o", "show", "node"]) if snapshot is None else _snapshot_file(snapshot, "nodes.txt")


def snapshot_path(snapshot: str, name: str) -> Path:
    return Path(snapshot).expanduser() / name


def _snapshot_file(snapshot: str, name: str) -> str:
    """A snapshot file's text, believed only whole: UTF-8, and ending with a line break as everything scontrol
    prints does (a file cut short stops inside its last line)."""
    path = snapshot_path(snapshot, name)
    if not path.is_file():
        raise ConfigError(f"snapshot file {path} does not exist")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read snapshot file {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"snapshot file {path}: line {line} is not UTF-8 text (byte 0x{data[e.start]:02x} at "
                          f"column {column}): capture the snapshot again with slurm/capture.sh, or convert the file "
                          f"(iconv -f latin1 -t utf-8)") from None
    if text and not text.endswith("\n"):
        raise ConfigError(f"snapshot file {path}: line {text.count(chr(10)) + 1} ends without a line break, so the "
                          f"file was cut short inside it (everything scontrol prints ends with one): capture the "
                          f"snapshot again with slurm/capture.sh")
    return text


# Fields `scontrol show node` prints last and only for some nodes: a record without them is not cut short
OPTIONAL_TAIL = frozenset({"Reason", "Comment", "Extra"})


def check_snapshot(snapshot: str, topology_file: str, items: list, nodes: list[Node]) -> None:
    """Refuse, in one line naming the file and the line, a snapshot whose node records do not cover its topology:
    a node of topology.txt (topology-NAME.txt) without a record in nodes.txt would be taken as free, whatever
    its state; a node recorded twice, or a record that stops where the others of the capture go on (a line
    cut short), cannot be believed either."""
    nodes_path, topo_path = snapshot_path(snapshot, "nodes.txt"), snapshot_path(snapshot, topology_file)
    recorded = {node.name: i for i, node in enumerate(nodes)}
    if len(recorded) < len(nodes):
        seen: dict[str, int] = {}
        i, first = next((i, seen[node.name]) for i, node in enumerate(nodes)
                        if node.name in seen or seen.setdefault(node.name, i) is None)
        lines = _record_lines(_snapshot_file(snapshot, "nodes.txt"))
        raise ConfigError(f"snapshot file {nodes_path}: line {lines[i]}: a second record of node {nodes[i].name} "
                          f"(the first is on line {lines[first]}): capture the snapshot again with slurm/capture.sh")
    cut = _cut_short(nodes)
    if cut is not None:
        i, last, lost = cut
        line = _record_lines(_snapshot_file(snapshot, "nodes.txt"))[i]
        raise ConfigError(f"snapshot file {nodes_path}: line {line}: the record of node {nodes[i].name} stops at "
                          f"{last}= where the capture's other records go on ({'=, '.join(lost[:3])}="
                          f"{', ...' if len(lost) > 3 else ''}): the line was cut short; capture the snapshot "
                          f"again with slurm/capture.sh")
    leaves = [(i, item) for i, item in enumerate(items) if not getattr(item, "switches", None)]
    named = set().union(*(item.nodes for _, item in leaves))
    missing = named.difference(recorded)
    if not missing:
        return
    i, first = next((i, host) for i, item in leaves for host in item.nodes if host in missing)
    hosts = compress(sorted(missing))
    hosts = hosts if len(hosts) <= 60 else hosts[:57] + "..."
    line = _item_lines(_snapshot_file(snapshot, topology_file))[i]
    if not nodes:
        raise ConfigError(f"snapshot file {nodes_path} holds no node record, but {topo_path} names {len(named)} "
                          f"nodes ({hosts}, from its line {line}): without their states every node would be taken "
                          f"as free; capture the snapshot again with slurm/capture.sh")
    raise ConfigError(f"snapshot file {nodes_path} has no record of {len(missing)} of the {len(named)} nodes "
                      f"{topo_path} names ({hosts}; {first} is on its line {line}): a node without a record would be "
                      f"taken as free whatever its state; capture the snapshot again with slurm/capture.sh (nodes "
                      f"SLURM shows no record of, State=FUTURE ones, go from {topology_file} by hand)")


def _cut_short(nodes: list[Node]) -> tuple[int, str, list[str]] | None:
    """(index, last field, the fields it lacks) of the first record whose fields stop where other records of the
    same capture go on with at least two more (besides OPTIONAL_TAIL), or None. Records of one capture come
    in a few shapes (the fields, in order), told apart by their last field and count, compared shape with shape."""
    first: dict[tuple, int] = {}
    for i, node in enumerate(nodes):
        first.setdefault((next(reversed(node.fields)), len(node.fields)), i)
    if len(first) < 2:
        return None
    shapes = {tuple(nodes[i].fields): i for i in first.values()}
    for shape, first in sorted(shapes.items(), key=lambda item: item[1]):
        last, have = shape[-1], set(shape)
        for other in shapes:
            if other is shape or last not in other:
                continue
            lost = [k for k in other[other.index(last) + 1:] if k not in have and k not in OPTIONAL_TAIL]
            if len(lost) >= 2:
                return first, last, lost
    return None


def _record_lines(text: str) -> list[int]:
    """The line number each node record starts on (records: parse_nodes)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line[0].isspace()]


def _item_lines(text: str) -> list[int]:
    """The line number of each topology line (items: parse_topology)."""
    return [n for n, line in enumerate(text.splitlines(), 1) if line.strip()]
