"""Who am I and where is rank 0: rank, world and rendezvous from torchrun, srun or submitit.

The rendezvous address is always the host of rank 0. Under srun/submitit we do
not guess it from the node list (wrong as soon as the allocator reorders
ranks): either the launcher exports MASTER_ADDR, or rank 0 publishes its host
and a free port in a file under the run directory (a shared filesystem, as
submitit already requires) and the other ranks read it.
"""
from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from train.contract.common import FedshardError, free_port, write_atomic


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # torchrun | slurm | submitit-local | single
    job_tag: str  # distinguishes attempts of a job for the rendezvous file
    local_world: int = 1  # ranks sharing this host
    seat: "Seat | None" = None  # train.fault_tolerance=groups: its federation group, which is its world

    @property
    def host(self) -> str:
        return socket.gethostname()


@dataclass(frozen=True)
class Seat:
    """Where a rank of a fault-tolerant run sits (train.fault_tolerance=groups): its federation group, which is its
    world, the Lighthouse the groups meet at, and which start of the group this is (0: the first; more: restarted
    after a loss, train.job.forked_ranks)."""

    group: int
    lighthouse: str
    start: int


def seat(environ=os.environ) -> Seat | None:
    """This rank's seat, as the local job's supervisor or the launcher's group job (launcher.groups) set it, or None
    outside a fault-tolerant run."""
    if "FEDSHARD_GROUP" not in environ:
        return None
    return Seat(int(environ["FEDSHARD_GROUP"]), environ["FEDSHARD_LIGHTHOUSE"],
                int(environ.get("FEDSHARD_GROUP_START", 0)))


def detect(environ=os.environ) -> DistEnv:
    """Read rank/world/local rank from whichever launcher started us (torchrun wins over SLURM).

    FEDSHARD_RANK, when set, replaces the launcher's rank: the launcher's in-job placement sets it
    after reading the allocation, so mesh coordinates follow the topology rather than srun's order.
    """
    env = _launcher_env(environ)
    if "FEDSHARD_RANK" in environ:
        env.rank = int(environ["FEDSHARD_RANK"])
    env.seat = seat(environ)
    return env


def _launcher_env(environ) -> DistEnv:
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return DistEnv(int(environ["RANK"]), int(environ["WORLD_SIZE"]),
                       int(environ.get("LOCAL_RANK", 0)), "torchrun", "torchrun",
                       int(environ.get("LOCAL_WORLD_SIZE", 1)))
    if "SUBMITIT_LOCAL_GLOBALID" in environ:
        return DistEnv(int(environ["SUBMITIT_LOCAL_GLOBALID"]), int(environ["SUBMITIT_LOCAL_NTASKS"]),
                       int(environ.get("SUBMITIT_LOCAL_LOCALID", 0)), "submitit-local",
                       f"local-{environ.get('SUBMITIT_LOCAL_JOB_ID', 'job')}", int(environ["SUBMITIT_LOCAL_NTASKS"]))
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        tag = f"slurm-{environ.get('SLURM_JOB_ID', 'job')}-{environ.get('SLURM_STEP_ID', '0')}" \
              f"-{environ.get('SLURM_RESTART_COUNT', '0')}"
        return DistEnv(int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"]),
                       int(environ.get("SLURM_LOCALID", 0)), "slurm", tag,
                       int(environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]))
    return DistEnv(0, 1, 0, "single", f"single-{os.getpid()}")


def rendezvous(env: DistEnv, run_dir: Path, timeout_s: float, environ=os.environ) -> tuple[str, int, str]:
    """Address and port of rank 0's host, and where they came from (for error messages)."""
    if "MASTER_ADDR" in environ and "MASTER_PORT" in environ:
        port = environ["MASTER_PORT"]
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise FedshardError(f"MASTER_PORT must be a port number (1-65535), got {port!r}")
        return environ["MASTER_ADDR"], int(port), "MASTER_ADDR/MASTER_PORT"
    if env.world_size == 1:
        return "127.0.0.1", free_port(), "a free local port"
    path = run_dir / f".rendezvous-{env.job_tag}"
    if env.rank == 0:
        addr, port = environ.get("MASTER_ADDR", env.host), int(environ.get("MASTER_PORT", 0)) or free_port()
        write_atomic(path, f"{addr} {port}\n")
        return addr, port, str(path)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise FedshardError(f"rank {env.rank}: rank 0 did not publish its address in {path} "
                                f"within {timeout_s:.0f} s (is the run directory on a shared filesystem?)")
        time.sleep(0.1)
    addr, port = path.read_text().split()
    return addr, int(port), str(path)


def limit_cpu_threads(env: DistEnv, environ=os.environ) -> None:
    """Share this host's CPUs among its ranks: oversubscribed OpenMP threads spin and slow CPU runs tenfold."""
    if "OMP_NUM_THREADS" not in environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // max(1, env.local_world)))


def pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise FedshardError("device=cuda was requested but CUDA is not available on this host")
    return requested


def sync_device(device: str) -> None:
    """Wait for the GPU's queued kernels (a no-op on CPU), so a timed region holds the work it names."""
    if device == "cuda":
        torch.cuda.synchronize()


def init(env: DistEnv, device: str, backend: str, run_dir: Path, timeout_s: float) -> str:
    """Start the default process group; returns the backend used."""
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    addr, port, where = rendezvous(env, run_dir, timeout_s)
    if env.seat is not None:  # a federation group's torchft manager meets its group's ranks at the same store
        os.environ.setdefault("MASTER_ADDR", addr)
        os.environ.setdefault("MASTER_PORT", str(port))
    if env.rank != 0:  # torch would retry with a C++ backtrace per attempt on stderr; say it in one line instead
        wait_listening(env, addr, port, where, timeout_s)
    try:
        # device_id: NCCL creates its communicators here, not inside step 0 (which would count in tokens/s)
        device_id = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else None
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=env.rank,
                                world_size=env.world_size, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device_id)
    except RuntimeError as exc:  # torch's DistNetworkError / DistStoreError: rank 0 gone, or a rank never came
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise FedshardError(f"rank {env.rank} of {env.world_size}: rendezvous at tcp://{addr}:{port} (from {where}) "
                            f"failed within train.timeout_s={timeout_s:g} s: {reason[:300]}") from None
    return backend


def apply_timeout(timeout_s: float) -> None:
    """Give every process group this rank is in (the mesh's dimensions, flattened meshes, the guard's) the run's
    timeout: torch gives each group after the default one its own default (10 min NCCL, 30 min gloo)."""
    c10d = dist.distributed_c10d
    for group in list(c10d._world.pg_map):
        if not c10d._rank_not_in_group(group):
            c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), group)


def wait_listening(env: DistEnv, addr: str, port: int, where: str, timeout_s: float) -> None:
    """Wait until rank 0's rendezvous port accepts connections, at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((addr, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))).close()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise FedshardError(f"rank {env.rank} of {env.world_size}: nothing answers at the rendezvous "
                                    f"tcp://{addr}:{port} (rank 0's address, from {where}) after train.timeout_s="
                                    f"{timeout_s:g} s: {exc.strerror or exc}") from None
        time.sleep(0.2)


def forget_rendezvous(env: DistEnv, run_dir: Path) -> None:
    """Rank 0 removes its address: a requeued local job keeps its tag and must not find the old one."""
    if env.rank == 0:
        (run_dir / f".rendezvous-{env.job_tag}").unlink(missing_ok=True)


def shutdown(env: DistEnv, run_dir: Path) -> None:
    if not dist.is_initialized():
        return
    dist.barrier()
    forget_rendezvous(env, run_dir)
    dist.destroy_process_group()


ALLOC_CONF = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch's allocator settings, new name and old


def expandable_segments(environ=os.environ) -> None:
    """The CUDA caching allocator grows segments in place instead of fragmenting (expandable_segments:True), unless
    the user set its configuration; read at the first CUDA allocation, so set before the model is built."""
    if not any(name in environ for name in ALLOC_CONF):
        environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"


def alloc_conf(device: str) -> str | None:
    """The allocator configuration the run had (result.json), None on CPU."""
    if device != "cuda":
        return None
    return next((f"{name}={os.environ[name]}" for name in ALLOC_CONF if name in os.environ), "(torch's default)")
