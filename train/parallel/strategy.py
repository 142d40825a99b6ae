"""What a strategy is, in one place: a row of STRATEGIES. The paper's four strategies differ in two choices only,
whether ranks form F federation groups that average every A steps (federated) and whether each group holds R
replicas of its shard group on a 2-D replicate x shard mesh (replicated); every rule the launcher and the trainer
apply to a strategy (its grid on some nodes, the layouts the ranking tries, how it shrinks onto fewer nodes, its
data-parallel mesh, the (F, R) it accepts, its name in the paper's tables) is derived from those two here. A row
may also fix the outer step its groups exchange (DiLoCo over HSDP groups as a strategy of its own, say).
Torch-free, so the launcher plans without importing torch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    name: str        # as sweeps and run ids spell it: fl_hsdp
    label: str       # as the paper's tables print it: FL+HSDP
    federated: bool  # F >= 2 federation groups, an outer step (FedAvg or DiLoCo) every A steps
    replicated: bool  # R replicas of the shard group inside a group (HSDP's 2-D mesh)
    exchange: str | None = None  # the outer step the row fixes (a train.outer value: diloco); None: train.outer's

    @property
    def chooses_F(self) -> bool:
        """Whether the sweep's F applies: only a strategy with both groups and replicas splits nodes between them."""
        return self.federated and self.replicated

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """The train.parallel.mesh dimensions fully_shard shards (and replicates) over."""
        return ("replicate", "shard") if self.replicated else ("shard",)

    def grid(self, nodes: int, S: int, F: int | None = None) -> tuple[int, int, int]:
        """(F, R, S) on `nodes` nodes of S shards each: FSDP shards over them all, HSDP replicates one node's shard
        group over them, FL+FSDP makes each node a group, FL+HSDP splits them into F groups (ValueError when F
        cannot)."""
        if not self.federated:
            return (1, nodes, S) if self.replicated else (1, 1, nodes * S)
        if not self.replicated:
            return nodes, 1, S
        if F is None or F < 2 or nodes % F:
            raise ValueError(f"{self.name}: F={F} federation groups must be >= 2 and divide the {nodes} nodes")
        return F, nodes // F, S

    def candidates(self, nodes: int, S: int, As) -> list[tuple[int, int, int, int | None]]:
        """The (F, R, S, A) layouts the ranking tries on `nodes` nodes of S shards (none that needs more nodes)."""
        if not self.federated:
            return [self.grid(nodes, S) + (None,)] if nodes > 1 or not self.replicated else []
        if nodes < 2:
            return []
        Fs = [F for F in range(2, nodes) if nodes % F == 0] if self.chooses_F else [None]
        return [self.grid(nodes, S, F) + (A,) for F in Fs for A in As]

    def accepts(self, F: int, R: int) -> str | None:
        """Why (F, R) is not a layout of this strategy, or None when it is."""
        if not self.federated and not self.replicated and (F, R) != (1, 1):
            return f"{self.name} needs F = 1 and R = 1"
        if not self.federated and F != 1:
            return f"{self.name} needs F = 1 (use fl_{self.name} for federation groups)"
        if not self.replicated and R != 1:
            return f"{self.name} needs R = 1 (use {self.name.replace('fsdp', 'hsdp')} for replicas)"
        return None


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("fsdp", "FSDP", federated=False, replicated=False),
    Strategy("hsdp", "HSDP", federated=False, replicated=True),
    Strategy("fl_fsdp", "FL+FSDP", federated=True, replicated=False),
    Strategy("fl_hsdp", "FL+HSDP", federated=True, replicated=True),
)}


def strategy(name: str) -> Strategy:
    """The row of a strategy name; ValueError naming the known ones."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}") from None


@dataclass(frozen=True)
class Layout:
    """One layout of the ranks: a strategy, its grid F x R x S of data-parallel ranks, each a pipeline of P stages
    of T tensor-parallel pieces, and its outer period A (None for a strategy without federation groups). The value
    the sweep, plan, prediction, cost model, ranking and reports pass around, in the manner of torchtitan's
    ParallelDims: frozen, with what follows from it derived."""

    strategy: str
    F: int
    R: int
    S: int
    A: int | None = None
    P: int = 1
    T: int = 1

    @property
    def row(self) -> Strategy:
        return STRATEGIES[self.strategy]

    @property
    def federated(self) -> bool:
        return self.row.federated

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks, each training on its own batches."""
        return self.F * self.R * self.S

    @property
    def world(self) -> int:
        return self.dp_world * self.P * self.T

    @property
    def label(self) -> str:
        """fl_hsdp  (F,R,S)=(2,64,4) A=32 pp=2 tp=2, as the plan's ranking prints a layout."""
        A = f" A={self.A}" if self.A else ""
        mp = "".join(f" {k}={v}" for k, v in (("pp", self.P), ("tp", self.T)) if v > 1)
        return f"{self.strategy:<8} (F,R,S)=({self.F},{self.R},{self.S}){A}{mp}"
