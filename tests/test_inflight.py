"""Exchanges in flight without threads (train.federation.inflight), on real gloo ranks: launching waits for nothing, the
value is right where it is used, and the clock counts the exchange's own time, not the time it stayed in flight."""
import threading
import time

import torch
import torch.distributed as dist

from tests.support import run_ranks
from train.federation import compress, inflight

WORLD = 2
TRAINING_S = 0.5  # what the host does while the exchange is in flight
STEPS = 10


def _fp32_mean(x: torch.Tensor, world: int):
    total = x.clone()
    yield from inflight.launched(lambda: [dist.all_reduce(total, async_op=True)])
    return total / world


def _exchange(rank: int, world: int):
    x = torch.full((compress.padded(300, world),), float(rank + 1))
    clock, threads = inflight.ExchangeClock("cpu"), threading.active_count()
    waits, wait = [], dist.Work.wait
    dist.Work.wait = lambda work, *a, **k: waits.append(1) or wait(work, *a, **k)
    try:
        flight = inflight.InFlight(inflight.together([_fp32_mean(x, world),
                                                      compress.mean_over(x, world, dist.group.WORLD, "bf16")]), clock)
        waited_at_launch, in_flight = len(waits), not flight.done
        for _ in range(STEPS):  # steps while it is in flight; after each, the clock asks gloo without waiting
            time.sleep(TRAINING_S / STEPS)
            clock.poll()
        fp32, (bf16, sent) = flight.result()
    finally:
        dist.Work.wait = wait
    return dict(waited_at_launch=waited_at_launch, waits=len(waits), in_flight=in_flight,
                threads=threading.active_count() - threads, fp32=fp32, bf16=bf16, sent=sent,
                seconds=clock.seconds(), stages=len(clock.spans))


def test_an_exchange_in_flight_waits_only_where_its_value_is_used():
    for out in run_ranks(_exchange, WORLD):
        assert out["in_flight"] and out["waited_at_launch"] == 0  # async_op: nothing waited before the value is used
        assert out["waits"] == 3  # the all_reduce and the all_to_all (stage 1), the all_gather (stage 2)
        assert out["threads"] == 0  # no Python thread carries it
        assert torch.equal(out["fp32"], torch.full_like(out["fp32"], 1.5))
        assert torch.equal(out["bf16"], torch.full_like(out["bf16"], 1.5))
        assert out["stages"] == 2
        # from each stage's launch to the first step end that finds it completed: not the half second in flight
        assert 0 < out["seconds"] < TRAINING_S / 2


def test_a_blocking_exchange_runs_its_stages_in_order():
    outs = run_ranks(_blocking, WORLD)
    assert all(torch.equal(o, torch.full_like(o, 1.5)) for o in outs)


def _blocking(rank: int, world: int):
    x = torch.full((compress.padded(300, world),), float(rank + 1))
    mean, _ = inflight.run(compress.mean_over(x, world, dist.group.WORLD, "int8"))
    return mean
