"""The one place that runs `scontrol` and `squeue`: topology and node texts (live, or from a snapshot
directory of topology.txt and nodes.txt), job states, the cluster's name, whether accounting answers.
Their text is parsed by launcher.slurm.parse."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from launcher.errors import ConfigError, SlurmError
from launcher.slurm.parse import parse_key_values


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


def topology_text(snapshot: str | None) -> str:
    """`scontrol show topology`, or topology.txt of a snapshot directory."""
    return run_scontrol(["show", "topology"]) if snapshot is None else _snapshot_file(snapshot, "topology.txt")


def nodes_text(snapshot: str | None) -> str:
    """`scontrol -d -o show node` (-d: GresUsed, the GPUs in use), or nodes.txt of a snapshot directory."""
    return run_scontrol(["-d", "-o", "show", "node"]) if snapshot is None else _snapshot_file(snapshot, "nodes.txt")


def _snapshot_file(snapshot: str, name: str) -> str:
    path = Path(snapshot) / name
    if not path.is_file():
        raise ConfigError(f"snapshot file {path} does not exist")
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read snapshot file {path}: {e.strerror}") from None
