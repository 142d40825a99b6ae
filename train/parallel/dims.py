"""The parallel dimensions of a run, (fed, replicate, shard, pp, tp), in the manner of torchtitan's ParallelDims.

Rank k sits at (f, r, s, p, t) in row-major order: the tensor-parallel group is innermost (consecutive ranks, so
one node), pipeline stages next, then the F x R x S grid of data-parallel ranks, each of which holds one
pipeline of P stages of T tensor-parallel pieces. Pure arithmetic, so the launcher uses it without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

NAMES = ("fed", "replicate", "shard", "pp", "tp")


@dataclass(frozen=True)
class Dims:
    F: int
    R: int
    S: int
    P: int = 1
    T: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return self.F, self.R, self.S, self.P, self.T

    @property
    def world(self) -> int:
        return self.F * self.R * self.S * self.P * self.T

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks: each trains on its own batches (its stream); the P x T ranks under it share them."""
        return self.F * self.R * self.S

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
