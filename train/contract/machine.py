"""Which machine made a result or a probe: CPU model, cores, memory, kernel, load average at start, Python, torch and
fedshard versions, fedshard's git commit and a short digest of the host name (never the name itself).

Torch-free: the trainer (rank 0, at the start of each attempt), the probe job and the launcher (which machine it
runs on, to tell a sweep's own runs from runs finished elsewhere) gather it the same way. Each field is null where
this machine cannot say."""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when fedshard runs from one


def host_digest(name: str | None = None) -> str:
    """12 hex digits of the SHA-256 of a host name (this one's by default): the same host gives the same digest,
    and the name does not leave the machine."""
    return hashlib.sha256((socket.gethostname() if name is None else name).encode()).hexdigest()[:12]


def describe(gpu: str | None = None) -> dict:
    """This machine now, as result.json's and probe.json's `machine`: `gpu` is the caller's (the trainer knows its
    device; the contract does not import torch)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"host": host_digest(), "cpu": _cpu_model(), "cores": os.cpu_count(), "cores_usable": _usable_cores(),
            "memory_bytes": _memory_bytes(), "kernel": platform.release() or None, "load_avg": load,
            "python": platform.python_version(), "torch": _version("torch"), "fedshard": _version("fedshard"),
            "commit": commit(), "gpu": gpu}


def label(machine: dict | None) -> str:
    """A machine in a few words for a message: its CPU, cores, memory, host digest and commit ("not recorded" for a
    result or probe written before machines were)."""
    if not machine:
        return "not recorded"
    parts = [machine.get("cpu") or "CPU unknown", f"{machine.get('cores') or '?'} cores"]
    if machine.get("memory_bytes"):
        parts.append(f"{machine['memory_bytes'] / 1e9:.3g} GB")
    if machine.get("gpu"):
        parts.append(machine["gpu"])
    parts.append(f"host {machine.get('host') or '?'}")
    if machine.get("commit"):
        parts.append(f"commit {machine['commit'][:7]}{'-dirty' if machine['commit'].endswith('-dirty') else ''}")
    return ", ".join(parts)


@functools.lru_cache(maxsize=1)
def commit() -> str | None:
    """fedshard's git commit (with -dirty when the work tree differs), None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def _version(package: str) -> str | None:
    loaded = sys.modules.get(package)  # the one running (a checkout's torch may not be the installed one)
    if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
        return loaded.__version__
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def _usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
