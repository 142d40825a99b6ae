"""Energy of the training time, read from the hardware's own cumulative counters by one rank per node.

GPUs: NVML's total-energy counter of every GPU the job's ranks on the node use (nvidia-ml-py), found by UUID, so
a reader whose own CUDA_VISIBLE_DEVICES shows one GPU (per-task GPU binding) still counts its node's others.
CPUs: RAPL's package counters (/sys/class/powercap), where readable. Otherwise nothing: the fields stay null and
`source` says why; energy is never estimated from a TDP. One reader per node, because every counter covers the
whole device or socket: readers on several ranks of a node would count it several times. A node is a machine (its
kernel's boot id), so the testbed's virtual nodes, which share one machine, share one reader too. A sampler thread
reads the counter once a second while training runs, so a RAPL counter that wraps is followed; the meter pauses
while checkpoints, logging and evaluations are timed apart, so the joules match train_time_s.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Callable

POWERCAP = Path("/sys/class/powercap")
MIN_WINDOW_S = 1.0  # counters update every few to hundreds of milliseconds: shorter windows are not measurements


class Unavailable(Exception):
    """No counter this node can read; the message says why."""


class RaplCounter:
    """Joules of the CPU packages (top-level intel-rapl:N zones; their sub-zones are parts of them), each
    counter's wraparound at max_energy_range_uj undone between reads."""

    source = "rapl: CPU package counters (whole sockets, other processes included)"

    def __init__(self, root: Path = POWERCAP):
        zones = sorted(z for z in root.glob("intel-rapl:*") if z.name.count(":") == 1)
        if not zones:
            raise Unavailable(f"no RAPL package zone under {root}")
        self.zones = zones
        try:
            self.ranges = [int((z / "max_energy_range_uj").read_text()) for z in zones]
            self.last = self._raw()
        except (OSError, ValueError) as exc:
            raise Unavailable(f"RAPL counters under {root} are not readable ({exc})") from None
        self.total_uj = 0

    def _raw(self) -> list[int]:
        return [int((z / "energy_uj").read_text()) for z in self.zones]

    def read(self) -> float:
        now = self._raw()
        for i, (before, after) in enumerate(zip(self.last, now)):
            self.total_uj += after - before if after >= before else after + self.ranges[i] - before
        self.last = now
        return self.total_uj / 1e6


class NvmlCounter:
    """Joules of the given GPUs (NVML UUIDs) since their driver loaded (a 64-bit millijoule counter)."""

    source = "nvml: total energy of the node's GPUs"

    def __init__(self, uuids: list[str]):
        try:
            import pynvml
        except ImportError:
            raise Unavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
        if not uuids:
            raise Unavailable("no GPU of this node is known to NVML by UUID")
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
            self._energy = pynvml.nvmlDeviceGetTotalEnergyConsumption
            self.read()
        except pynvml.NVMLError as exc:
            raise Unavailable(f"NVML cannot read the GPUs' energy ({exc})") from None
        self.source = f"nvml: total energy of the node's {len(uuids)} GPU(s) the job uses"

    def read(self) -> float:
        return sum(self._energy(h) for h in self.handles) / 1e3


def machine_id() -> str:
    """What identifies the physical machine: its kernel's boot id (the same in every network or UTS namespace)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def gpu_uuid(device: str) -> str | None:
    """This rank's GPU as NVML names it (GPU-<uuid>), for its node's reader; None on CPU."""
    if device != "cuda":
        return None
    import torch
    return f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"


def node_gpus(machines: list[str], gpus: list[str | None], rank: int) -> list[str]:
    """The GPUs of every rank on `rank`'s machine, each once (ranks may share one), in rank order."""
    return list(dict.fromkeys(g for m, g in zip(machines, gpus) if m == machines[rank] and g is not None))


def open_counter(device: str, gpus: list[str], root: Path = POWERCAP):
    """This node's energy counter for `device` (on GPU, over `gpus`: node_gpus); Unavailable when there is none."""
    if device == "cuda":
        return NvmlCounter(gpus)
    return RaplCounter(root)


class EnergyMeter:
    """Joules between start() and stop(), less what pause()/resume() leave out; read by a sampler thread."""

    def __init__(self, read: Callable[[], float], every_s: float = 1.0):
        self.read, self.every_s = read, every_s
        self.joules = self.seconds = 0.0
        self._lock = threading.Lock()
        self._since: tuple[float, float] | None = None  # (counter, clock) when the current window opened
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._restart: Callable[[], bool] | None = None  # restart_when

    def start(self) -> None:
        self.resume()
        self._thread = threading.Thread(target=self._sample, name="energy-sampler", daemon=True)
        self._thread.start()

    def restart_when(self, ready: Callable[[], bool]) -> None:
        """Drop what was measured so far at the first sample (or stop) after `ready()` holds: the run's first step,
        which tokens/s leaves out, is left out of the joules too (on a GPU `ready` asks the first step's end event,
        without waiting for it)."""
        with self._lock:
            self._restart = ready

    def _sample(self) -> None:
        while not self._stopped.wait(self.every_s):
            with self._lock:
                self._maybe_restart()
                if self._since is not None:
                    self._since = self._advance()

    def _maybe_restart(self) -> None:
        if self._restart is not None and self._restart():
            self._restart = None
            if self._since is not None:
                self._since = (self.read(), time.perf_counter())
            self.joules = self.seconds = 0.0

    def _advance(self) -> tuple[float, float]:
        """Add the open window's joules and seconds up to now; returns (counter, clock) now."""
        now = (self.read(), time.perf_counter())
        self.joules += now[0] - self._since[0]
        self.seconds += now[1] - self._since[1]
        return now

    def resume(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = (self.read(), time.perf_counter())

    def pause(self) -> None:
        with self._lock:
            if self._since is not None:
                self._advance()
                self._since = None

    def stop(self) -> float | None:
        """Joules measured, or None when the windows add up to less than MIN_WINDOW_S."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._maybe_restart()
        self.pause()
        return self.joules if self.seconds >= MIN_WINDOW_S else None


def summary(readings: list[tuple[float | None, str | None]], tokens: int, seconds: float, devices: int) -> dict:
    """result.json's energy fields from every rank's (joules, source); ranks that read no counter give
    (None, None). Null fields where any node could not be measured, and energy_source says which and why."""
    readers = [(joules, source) for joules, source in readings if source is not None]
    failed = [source for _, source in readers if source.startswith("none:")]
    if not failed and any(joules is None for joules, _ in readers):
        failed = [f"none: training ran under the {MIN_WINDOW_S:g} s a counter reading needs"]
    if failed:
        more = f" (and {len(failed) - 1} more node(s))" if len(failed) > 1 else ""
        return {"energy_j": None, "avg_power_w_per_device": None, "tokens_per_j": None,
                "energy_source": failed[0] + more}
    joules = sum(j for j, _ in readers)
    return {"energy_j": joules, "avg_power_w_per_device": joules / seconds / devices, "tokens_per_j": tokens / joules,
            "energy_source": f"{readers[0][1]}; {len(readers)} node reader(s)"}
