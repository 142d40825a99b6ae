"""result.json's rank-reduced measures are reduced by name (train.measure.metrics.across_ranks), on real gloo ranks:
each by its own reduction, ints staying ints, one collective per kind of reduction."""
import pytest
import torch.distributed as dist

from tests.support import run_ranks
from train.measure import metrics


def _reduce(rank: int, world: int):
    calls, all_reduce = [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: calls.append(k.get("op")) or all_reduce(*a, **k)
    try:
        out = metrics.across_ranks({"peak_memory_bytes": ("max", 100 * (rank + 1)), "exchange_s": ("max", 0.5 * rank),
                                    "tokens": ("sum", 7 + rank)}, "cpu")
    finally:
        dist.all_reduce = all_reduce
    return out, len(calls)


@pytest.mark.slow
def test_named_measures_are_reduced_by_their_own_reduction():
    for out, collectives in run_ranks(_reduce, 2):
        assert out == {"peak_memory_bytes": 200, "exchange_s": 0.5, "tokens": 15}
        assert isinstance(out["peak_memory_bytes"], int) and isinstance(out["exchange_s"], float)
        assert collectives == 2  # one MAX for both maxima, one SUM
