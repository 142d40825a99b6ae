"""What one collective costs on this cluster's links: alpha and link bandwidth per (level, collective), measured by
action=probe or the cluster's nominal bandwidth, and what the probe measured of the runs' own groups.

From a probe (issue 54, item 2), a collective of `size` bytes on n ranks whose groups load the levels with `flows`:
- the run's own groups, timed at their own size, every group at once (probe.json's `scale` rows): their own fit,
  which holds the ring's steps, the flows and the efficiency at that size the level's 2-rank fit cannot;
- else the level's fit, alpha_0 + alpha per ring step + size x busfactor(n) x flows / link, where alpha per ring
  step comes from the level's 2-rank pairs and its own groups at other sizes (a line through their latencies);
and either way the slowest of n, not a median: a synchronising collective ends when its slowest member's call does,
so each is priced at the expected slowest of n draws from the per-call distribution the probe kept (jitter), over
the slowest member's median the fit was made on. Nominal bandwidth has none of this: alpha 0, no jitter.
Pure Python: the planner reads probe.json without torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.placement.alphabeta import COLLECTIVES, Fit, bus_factor, expected_max
from launcher.placement.levels import level_name
from train.contract.common import ConfigError


@dataclass(frozen=True)
class Link:
    alpha_s: float
    bytes_per_s: float         # bus bandwidth of one link of the level when one group uses it
    step_alpha_s: float = 0.0  # latency per ring step (NCCL's own tuning model prices rings so): alpha_s is then
                               # the part that does not grow with the ring, alpha_0


def ring_steps(collective: str, ranks: int) -> int:
    """Steps of a ring collective on n ranks: 2(n-1) for all_reduce, n-1 for the others."""
    return 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1


@dataclass(frozen=True)
class Spread:
    """A probe row's per-call distribution at each size it timed: (bytes, quantiles_s, the seconds its fit took)."""

    points: tuple[tuple[float, tuple[float, ...], float], ...]

    @classmethod
    def of(cls, row: dict) -> "Spread | None":
        if not row.get("dist"):
            return None  # a probe from before distributions were kept
        return cls(tuple((float(d["bytes"]), tuple(d["quantiles_s"]), float(p[1]))
                         for d, p in zip(row["dist"], row["points"])))

    def slowest_of(self, ranks: int, size: float) -> float:
        """E[slowest of `ranks` calls] over the seconds the fit was made on, at the size timed nearest `size` (in
        ratio: sizes are a factor 4 apart); at least 1."""
        _, quantiles, fitted = min(self.points, key=lambda p: abs(_log(p[0]) - _log(size)))
        return max(1.0, expected_max(list(quantiles), ranks) / fitted) if fitted > 0 else 1.0


def _log(x: float) -> float:
    return math.log(max(x, 1.0))


class Network:
    """Alpha and link bandwidth per (level, collective): measured by action=probe, or the cluster's nominal
    per-level bandwidth with no latency term; with a probe, the runs' own groups and the jitter (module docstring)."""

    def __init__(self, links: dict[tuple[str, str], Link], source: str, shared: bool = True,
                 groups: dict[tuple, tuple[Fit, Spread | None]] | None = None,
                 spread: dict[tuple[str, str], Spread] | None = None):
        """`shared`: a link's bandwidth is split among the groups crossing it (flows); False where the
        bandwidth given is already each rank's share (cluster.bandwidth_GBps). `groups`: {(collective, ranks,
        level name, flows): (fit, spread)} of the runs' own groups; `spread`: {(level, collective): spread}."""
        self.links, self.source, self.shared = links, source, shared
        self.groups, self.spread = groups or {}, spread or {}

    @classmethod
    def from_probe(cls, probe: dict, source: str) -> "Network":
        """A probe row's link rate: its bus bandwidth times the groups that shared the link (launcher.actions.probe);
        alpha per ring step where the level has rows at two ring lengths; the runs' own groups (`scale`)."""
        groups, steps = {}, {}
        for e in probe.get("scale", []):
            if e.get("alpha_s") is None or e.get("level") in (None, "none"):
                continue
            groups[(e["collective"], e["ranks"], e["level"], e["flows"])] = (
                Fit(e["alpha_s"], e["bytes_per_s"]), Spread.of(e))
            steps.setdefault((e["level"], e["collective"]), []).append((ring_steps(e["collective"], e["ranks"]),
                                                                        e["alpha_s"]))
        links = {}
        for e in probe["levels"]:
            key = (e["level"], e["collective"])
            alpha0, per_step = _ring_alpha([(ring_steps(e["collective"], e.get("ranks", 2)), e["alpha_s"]),
                                            *steps.get(key, [])])
            links[key] = Link(alpha0, e["link_bytes_per_s"], per_step)
        spread = {(e["level"], e["collective"]): s for e in probe["levels"] if (s := Spread.of(e))}
        return cls(links, source, groups=groups, spread=spread)

    @classmethod
    def nominal(cls, bandwidth: list[float]) -> "Network":
        """bandwidth[i]: each rank's share in bytes/s inside a node (i = 0), then across each switch level, as
        cluster.bandwidth_GBps states it: contention is already in it, so flows do not divide it again."""
        return cls({(level_name(i - 1), c): Link(0.0, b) for i, b in enumerate(bandwidth) for c in COLLECTIVES},
                   "nominal bandwidth, no latency", shared=False)

    def seconds(self, collective: str, size: float, ranks: int, load: dict[int, int]) -> float:
        """One collective of `size` bytes (the whole buffer) on `ranks` ranks whose groups load the levels as
        `load` ({level: flows}, levels.traffic), the slowest of its ranks."""
        if ranks <= 1 or not load:
            return 0.0
        kind = "all_reduce" if collective == "all_to_all" else collective
        level = max(load)
        own = self.groups.get((kind, ranks, level_name(level), load[level]))
        if own is not None:
            measured, spread = own
            return measured.seconds(size) * (spread.slowest_of(ranks, size) if spread else 1.0)
        per_byte = max((flows if self.shared else 1) / self._link(lv, kind).bytes_per_s for lv, flows in load.items())
        top = self._link(level, kind)
        seconds = top.alpha_s + ring_steps(kind, ranks) * top.step_alpha_s + size * bus_factor(kind, ranks) * per_byte
        spread = self.spread.get((level_name(level), kind))
        return seconds * (spread.slowest_of(ranks, size) if spread else 1.0)

    def _link(self, level: int, collective: str) -> Link:
        key = (level_name(level), collective)
        if key not in self.links:
            raise ConfigError(f"{self.source} has no {key[1]} at level {key[0]}: probe the cluster with the "
                              f"sweep that needs it (action=probe)")
        return self.links[key]


def _ring_alpha(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(alpha_0, alpha per ring step) from (ring steps, fitted alpha) of a level's rows: a least-squares line where
    they span two ring lengths and it rises (through the origin where alpha_0 would be negative), else (the first
    row's latency, 0)."""
    if len({s for s, _ in points}) < 2:
        return points[0][1], 0.0
    n = len(points)
    mx, my = sum(s for s, _ in points) / n, sum(a for _, a in points) / n
    slope = sum((s - mx) * (a - my) for s, a in points) / sum((s - mx) ** 2 for s, _ in points)
    if slope <= 0:
        return points[0][1], 0.0
    if my - slope * mx < 0:  # a negative alpha_0 is noise: the line through the origin
        return 0.0, sum(s * a for s, a in points) / sum(s * s for s, _ in points)
    return my - slope * mx, slope

