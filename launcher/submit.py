"""What a SLURM job is asked for (sbatch parameters, the script the plan shows) and where a job's files are;
launcher.scheduler submits, polls and cancels."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from launcher.settings import Cluster
from launcher.slurm.hostlist import compress
from launcher.sweep import PlannedRun, Run
from train.contract import submitit_compat
from train.contract.common import SubmitError


def attempt_folder(run_dir: Path, attempt: int) -> Path:
    """A submitit folder per attempt: job ids restart on a fresh cluster and must not meet stale outputs."""
    return run_dir / "submitit" / f"attempt{attempt}"


def hostfile_path(run: Run) -> Path:
    return Path(run.spec.out_dir) / "hostfile"


def slurm_parameters(cluster: Cluster, planned: PlannedRun) -> dict:
    """submitit SlurmExecutor parameters (names as sbatch's, underscores for dashes).

    pinned: the planned nodes (--nodelist) and, since an ordered nodelist does not order ranks,
    a hostfile with `srun --distribution=arbitrary`. in_job: only --nodes, and --switches or --segment
    as the plan asks (launcher.planning.topology_request); ranks are ordered at job start by PlacedTrainJob.
    """
    run = planned.run
    params = {"job_name": run.run_id, "nodes": run.nodes, "ntasks_per_node": cluster.gpus_per_node,
              "time": cluster.time_min, "partition": cluster.partition, "setup": list(cluster.setup)}
    extra = dict(cluster.sbatch_extra)
    if cluster.placement == "pinned":
        params["nodelist"] = compress(planned.placement.nodes)
        params["srun_args"] = ["--distribution=arbitrary"]
        params["setup"].append(f"export SLURM_HOSTFILE={shlex.quote(str(hostfile_path(run)))}")
    else:
        extra = {**planned.topology_request, **extra}
    if cluster.device == "cuda":
        params["gpus_per_node"] = cluster.gpus_per_node
    for key in ("account", "qos", "cpus_per_task", "mem"):
        if getattr(cluster, key) not in (None, ""):
            params[key] = str(cluster.mem) if key == "mem" else getattr(cluster, key)
    known = submitit_compat.slurm_parameter_names()
    params.update({k: extra.pop(k) for k in list(extra) if k in known})
    if extra:
        params["additional_parameters"] = extra
    return params


def group_parameters(cluster, planned: PlannedRun, group: int, start: int, lighthouse: str) -> dict:
    """sbatch parameters of group `group`'s job (its `start`-th submission): the group's nodes, asked under one switch
    (or in one segment) when the run asked for its topology and the group spans nodes (its replicas' traffic stays
    there), and its seat exported to every task."""
    run, L = planned.run, planned.run.spec.layout
    params = slurm_parameters(cluster, planned)
    nodes = run.nodes // L.F
    extra = params.pop("additional_parameters", {})
    asked = {k for k in ("switches", "segment") if extra.pop(k, None) is not None}
    if nodes > 1 and asked:
        wait = f"{cluster.switches_wait_min:02d}:00"
        extra.update({"segment": nodes} if "segment" in asked else {"switches": f"1@{wait}"})
    params.update(job_name=f"{run.run_id}-group{group}", nodes=nodes, additional_parameters={**extra,
                  "no_requeue": True}, setup=[*params["setup"], f"export FEDSHARD_GROUP={group}",
                                              f"export FEDSHARD_GROUP_START={start}",
                                              f"export FEDSHARD_LIGHTHOUSE={lighthouse}"])
    return params


def sbatch_text(cluster: Cluster, planned: PlannedRun, folder: Path) -> str:
    """The script submitit would submit for this run (shown by action=plan); for fault-tolerant groups, group 0's
    job, one of F alike."""
    if planned.run.spec.train.fault_tolerance == "groups":
        F = planned.run.spec.layout.F
        script = submitit_compat.sbatch_script(folder / "group0", group_parameters(cluster, planned, 0, 0,
                                                                                   LIGHTHOUSE_SHOWN), cluster.python)
        head, _, body = script.partition("\n")
        return (f"{head}\n# train.fault_tolerance=groups: one job per federation group, {F} alike (FEDSHARD_GROUP "
                f"0 to {F - 1}); the Lighthouse's address is known once the launcher starts it\n{body}")
    return submitit_compat.sbatch_script(folder, slurm_parameters(cluster, planned), cluster.python)


def require_netns(cluster: Cluster) -> None:
    """Clusters reachable only from a network namespace (the testbed) refuse clients started elsewhere."""
    if not cluster.netns:
        return
    target = Path("/run/netns") / cluster.netns
    if not target.exists() or os.stat("/proc/self/ns/net").st_ino != os.stat(target).st_ino:
        raise SubmitError(f"cluster {cluster.name!r} must be used from network namespace {cluster.netns}: "
                          f"run `slurm/testbed/lab python -m launcher ...` (is the testbed up?)")
    running_shape(cluster, Path(os.environ.get("SLURM_CONF", "/nonexistent")).parent / "network.json")


def running_shape(cluster: Cluster, built: Path) -> None:
    """A testbed cluster file whose network is not the one running (`built`: the network.json testbed.py up wrote
    beside the lab wrapper's slurm.conf) would be planned on one shape and run on another: refused."""
    if not cluster.network or not built.is_file():
        return
    running = json.loads(built.read_text())
    keys = ("leaves", "node_link", "trunk")
    if any(running.get(k) != cluster.network.get(k) for k in keys):
        raise SubmitError(f"cluster {cluster.name!r} describes another testbed shape than the one running "
                          f"({running.get('cluster')}: {', '.join(f'{k}={running.get(k)}' for k in keys)}): "
                          f"bring the testbed up with `python slurm/testbed/testbed.py up --cluster "
                          f"{cluster.name}` after `down`, or run with cluster={running.get('cluster')}")


LIGHTHOUSE_SHOWN = "http://LIGHTHOUSE_HOST:PORT"  # in the plan's script: the address exists once the launcher runs


def task_lines(job, prefix: str, stream: str = "stdout") -> list[str]:
    """The lines task 0 of `job` wrote to `stream` that start with `prefix` (its progress); [] before any."""
    paths = submitit_compat.task_paths(job.paths.folder, job.job_id, 0)
    try:
        text = getattr(paths, stream).read_text(errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.startswith(prefix)]
