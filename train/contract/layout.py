"""What a strategy is, in one place: a row of STRATEGIES. The paper's four strategies differ in two choices only,
whether ranks form F federation groups that average every A steps (federated) and whether each group holds R
replicas of its shard group on a 2-D replicate x shard mesh (replicated); every rule the launcher and the trainer
apply to a strategy (its grid on some nodes, the layouts the ranking tries, how it shrinks onto fewer nodes, its
data-parallel mesh, the (F, R) it accepts, its name in the paper's tables) is derived from those two here. A row
may also fix the outer step its groups exchange (DiLoCo over HSDP groups as a strategy of its own, say).
Layout is the one value for how a run's ranks are laid out (strategy, F x R x S, A, P, T), in the manner of
torchtitan's ParallelDims. Torch-free, so the launcher plans without importing torch."""
from __future__ import annotations

from dataclasses import dataclass, replace

from train.contract.common import SpecError

NAMES = ("fed", "replicate", "shard", "pp", "tp")  # the mesh's dimensions, outermost first (train.parallel.mesh)


def seats(hosts: list[str]) -> list[tuple[str, int]]:
    """Each rank's seat, (its host, its place among that host's ranks), in rank order: what names the same rank in
    two numberings of one allocation (a plan's, and the order a job's ranks were really started in)."""
    taken: dict[str, int] = {}
    out = []
    for host in hosts:
        out.append((host, taken.get(host, 0)))
        taken[host] = out[-1][1] + 1
    return out


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
    """How a run's ranks are laid out: a strategy, its grid F x R x S of data-parallel ranks, each a pipeline of P
    stages of T tensor-parallel pieces, and its outer period A (None for a strategy without federation groups).

    Rank k sits at (f, r, s, p, t) in row-major order: the tensor-parallel group is innermost (consecutive ranks, so
    one node), pipeline stages next, then the data-parallel grid, one federation group's ranks contiguous. Checked
    when made, so a value that exists is a layout the trainer can run; what follows from it is derived here."""

    strategy: str
    F: int
    R: int
    S: int
    A: int | None = None
    P: int = 1
    T: int = 1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise SpecError(f"unknown strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        for key, what in (("F", "F"), ("R", "R"), ("S", "S"), ("P", "train.pp"), ("T", "train.tp")):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{what} must be a positive integer, got {value!r}")
        why = self.row.accepts(self.F, self.R)
        if why:
            raise SpecError(f"{why}; got (F, R, S) = ({self.F}, {self.R}, {self.S})")
        if not self.federated:
            if self.A is not None:
                raise SpecError(f"{self.strategy} never averages, so it takes no A (got A = {self.A!r})")
            return
        if self.F < 2:
            raise SpecError(f"{self.strategy} needs F >= 2 federation groups, got F = {self.F}")
        if not isinstance(self.A, int) or isinstance(self.A, bool) or self.A < 1:
            raise SpecError(f"A (aggregation period in steps) must be an integer >= 1, got {self.A!r}")

    @property
    def row(self) -> Strategy:
        return STRATEGIES[self.strategy]

    @property
    def federated(self) -> bool:
        return self.row.federated

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """Sizes of the mesh's dimensions (NAMES)."""
        return self.F, self.R, self.S, self.P, self.T

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks: each trains on its own batches (its stream); the P x T ranks under it share them."""
        return self.F * self.R * self.S

    @property
    def world(self) -> int:
        return self.dp_world * self.P * self.T

    @property
    def group_world(self) -> int:
        """Ranks of one federation group."""
        return self.world // self.F

    def coords(self, rank: int) -> tuple[int, int, int, int, int]:
        """(f, r, s, p, t) of a rank."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside a grid of {self.world}")
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def rank(self, coords: tuple[int, ...]) -> int:
        """The rank at (f, r, s, p, t)."""
        rank = 0
        for c, size in zip(coords, self.shape):
            rank = rank * size + c
        return rank

    def data_rank(self, rank: int) -> int:
        """The index of a rank's (f, r, s) in the data-parallel grid: the stream its batches come from."""
        return rank // (self.P * self.T)

    def regrid(self, F: int, R: int, S: int) -> "Layout":
        """The same strategy, A and model parallelism on another data-parallel grid (a shrink, an elastic resume)."""
        return replace(self, F=F, R=R, S=S)

    @property
    def name(self) -> str:
        """fl_hsdp-F16-R8-S4-A8, or fsdp-F1-R1-S8-P2-T4 with pipeline / tensor parallelism: a run id's stem."""
        name = f"{self.strategy}-F{self.F}-R{self.R}-S{self.S}" + (f"-A{self.A}" if self.A is not None else "")
        return name + (f"-P{self.P}" if self.P > 1 else "") + (f"-T{self.T}" if self.T > 1 else "")

    @property
    def label(self) -> str:
        """fl_hsdp  (F,R,S)=(2,64,4) A=32 pp=2 tp=2, as the plan's ranking prints a layout."""
        A = f" A={self.A}" if self.A else ""
        mp = "".join(f" {k}={v}" for k, v in (("pp", self.P), ("tp", self.T)) if v > 1)
        return f"{self.strategy:<8} (F,R,S)=({self.F},{self.R},{self.S}){A}{mp}"
