"""The step schedule (launcher.placement.schedule) held to cases worked by hand: one unit, two units with and without
FSDP2's prefetch, FedAvg every A, a pipeline slot, processor sharing on CPU; and the old sum (no overlap) and max
(full overlap) as its limits, which it reaches where nothing can overlap and where everything can."""
import random

import pytest

from launcher.placement.costmodel import Model
from launcher.placement.network import Network
from launcher.placement.schedule import Comm, Cores, Execution, Pipeline, Unit, run
from launcher.placement.steptime import (
    Compute,
    Links,
    Shapes,
    step_time,
)
from train.contract.layout import Layout

LEAF = (0,)


def _unit(gather=0.5, reduce=0.25, forward=1.0, backward=2.0, regather=True, levels=LEAF) -> Unit:
    return Unit(forward, backward, Comm(gather, "shard", levels), Comm(reduce, "shard", levels), regather=regather)


def test_one_unit_overlaps_nothing():
    # forward: gather 0-0.5, compute 0.5-1.5; backward: gather again 1.5-2.0, compute 2.0-4.0, reduce-scatter
    # 4.0-4.25; optimizer 4.25-4.75. Nothing runs beside the compute: the sum, with or without prefetch.
    for prefetch in (True, False):
        s = run([_unit()], 0.5, gpu=True, how=Execution(prefetch=prefetch))
        assert s.step_s == pytest.approx(1 + 2 + 0.5 + 0.5 + 0.5 + 0.25)
        assert s.compute_s == pytest.approx(3.5) and s.exposed_s == pytest.approx({"shard": 1.25})
        assert s.exposed_by_level_s == pytest.approx({"leaf": 1.25})


def test_two_units_the_second_gather_hides_behind_the_first_units_compute():
    # prefetch: forward gathers A 0-0.5, then B 0.5-1.0 beside A's compute (0.5-1.5), B computes 1.5-2.5;
    # backward, B first: gathered again 2.5-3.0 (nothing earlier to hide it), A's gather prefetched 3.0-3.5 beside
    # B's backward (3.0-5.0), B's reduce-scatter 5.0-5.25 beside A's backward (5.0-7.0), A's 7.0-7.25.
    # Exposed: the first gather, B's backward gather, the last reduce-scatter.
    units = [_unit(), _unit()]
    on = run(units, 0.0, gpu=True)
    assert on.step_s == pytest.approx(7.25) and on.exposed_s == pytest.approx({"shard": 0.5 + 0.5 + 0.25})
    # phases as result.json times them: backward until the last reduce-scatter has landed
    assert on.phases_s == pytest.approx({"forward": 2.5, "backward": 4.75, "optimizer": 0.0, "aggregation": 0.0})
    # without prefetch (the paper's FSDP1): B's forward gather waits for A's compute (1.5-2.0), A's backward gather
    # is issued when A is reached (5.5) and queues behind B's reduce-scatter on the same link (5.5-5.75): 5.75-6.25.
    # Every collective is exposed: the sum.
    off = run(units, 0.0, gpu=True, how=Execution(prefetch=False))
    assert off.step_s == pytest.approx(6 + 4 * 0.5 + 2 * 0.25) and off.exposed_s == pytest.approx({"shard": 2.5})
    # the max (full overlap) and the sum (no overlap) bound it
    assert max(6, 2.5) < on.step_s < off.step_s


def test_fedavg_every_A_is_amortised_and_never_overlapped():
    # the one-unit step (4.75 s) plus one exchange of 2 s every A = 4 steps, after the optimizer, on the spine
    fed = (Comm(2.0 / 4, "federation", (1,)),)
    s = run([_unit()], 0.5, gpu=True, federation=fed)
    assert s.step_s == pytest.approx(4.75 + 0.5)
    assert s.exposed_s == pytest.approx({"shard": 1.25, "federation": 0.5})
    assert s.exposed_by_level_s == pytest.approx({"leaf": 1.25, "spine": 0.5})
    assert s.phases_s == pytest.approx({"forward": 1.5, "backward": 2.75, "optimizer": 0.5, "aggregation": 0.5})
    # even with compute long enough to hide it
    long = run([_unit(forward=100.0)], 0.5, gpu=True, federation=fed)
    assert long.exposed_s["federation"] == pytest.approx(0.5)


def test_fedavg_through_the_step_model_halves_with_twice_A():
    shapes, model = Shapes(root=100, layer=10, layers=2), Model(params=120, layers=2, bytes_per_param=4)
    links = Links(Network.nominal([1e3, 1e2, 1e1]), {"shard": {-1: 1}, "replicate": {0: 1}, "federation": {1: 1}})
    compute = Compute(forward_s=1.0, backward_s=2.0, optimizer_s=4.0, source="test")
    a4, a8 = (step_time(Layout("fl_hsdp", 2, 2, 2, A), shapes, model, links, compute, True) for A in (4, 8))
    assert a4.comm_s["federation"] == pytest.approx(2 * a8.comm_s["federation"])
    assert a4.step_s - a8.step_s == pytest.approx(a8.comm_s["federation"])
    assert a4.exposed_s["federation"] == pytest.approx(a4.comm_s["federation"])


def test_a_pipeline_slot():
    # P = 2 stages, m = 2 microbatches: 3 slots each way, each ending in a 0.1 s send across the spine. The stage
    # (1 s forward, 2 s backward for both microbatches) is gathered once, in the first slot (0.3 s on the leaf before
    # its 0.5 s forward), and reduced once, after the last slot's 1 s backward: 0.3 + 0.5 + 0.1 | 1.0 + 0.2 (two
    # forward slots, one the bubble) | 2.0 + 0.2 (two backward slots) | 1.0, then the 0.1 s send beside the 0.2 s
    # reduce-scatter, which the optimizer waits for: 5.5 s
    unit = _unit(gather=0.3, reduce=0.2, forward=1.0, backward=2.0, regather=False)
    s = run([unit], 0.0, gpu=True, pipe=Pipeline(2, 2, Comm(0.1, "pipeline", (1,))))
    assert s.step_s == pytest.approx(5.5)
    assert s.compute_s == pytest.approx((1 + 2) * 3 / 2)  # the bubble: (m + P - 1) / m
    assert s.exposed_s == pytest.approx({"shard": 0.3 + 0.1, "pipeline": 0.6})


def test_processor_sharing_on_cpu():
    """8 ranks on 2 cores, the compute measured by all 8 at once (stretched 4x): 6 s measured is 1.5 s alone."""
    cores = Cores(ranks=8, cores=2, measured_ranks=8, measured_cores=2, wire_level=0)
    wire = _unit(gather=1.0, reduce=1.0, forward=2.0, backward=4.0)  # 3 s on the leaf's wires a step
    # with 3 s of waiting each rank is on a core a share u = s W / (s W + 3); 1 + 7u ranks share 2 cores:
    # s = (1 + 7u) / 2, i.e. s^2 - 2s - 1 = 0, s = 1 + sqrt 2; compute 1.5 s x 2.414 = 3.62 s instead of 6 s
    s = run([wire], 0.0, gpu=False, how=Execution(cores=cores))
    assert s.stretch == pytest.approx(1 + 2 ** 0.5)
    assert s.compute_s == pytest.approx(1.5 * (1 + 2 ** 0.5)) and s.step_s == pytest.approx(s.compute_s + 3)
    assert s.exposed_s == pytest.approx({"shard": 3.0})
    # the same bytes inside a node move through the cores (gloo copies them): every rank is always on a core, the
    # compute runs 4x slower than alone, as measured, and the step is the sum
    node = run([_unit(gather=1.0, reduce=1.0, forward=2.0, backward=4.0, levels=(-1,))], 0.0, gpu=False,
               how=Execution(cores=cores))
    assert node.stretch == pytest.approx(4) and node.step_s == pytest.approx(6 + 3)
    # nothing but compute: the probe's condition, the measured seconds
    alone = run([Unit(2.0, 4.0)], 0.0, gpu=False, how=Execution(cores=cores))
    assert alone.step_s == pytest.approx(6.0)
    # a rank per core: the sum, whatever it waits for
    roomy = Cores(ranks=2, cores=2, measured_ranks=2, measured_cores=2)
    assert run([wire], 0.0, gpu=False, how=Execution(cores=roomy)).step_s == pytest.approx(9.0)
    # on CPU every collective blocks the rank: prefetch changes nothing
    assert run([wire, wire], 0.0, gpu=False).step_s == run([wire, wire], 0.0, gpu=False,
                                                            how=Execution(prefetch=False)).step_s == pytest.approx(18)


SHAPES = Shapes(root=100, layer=10, layers=2)
FP32 = Model(params=120, layers=2, bytes_per_param=4)
COMPUTE = Compute(forward_s=1.0, backward_s=2.0, optimizer_s=4.0, source="test")


def _random_step(rng: random.Random, prefetch: bool, gpu: bool = True):
    strategy, F, R, S, A = rng.choice([("fsdp", 1, 1, 4, None), ("hsdp", 1, 2, 2, None), ("fl_fsdp", 2, 1, 2, 4),
                                       ("fl_hsdp", 2, 2, 2, 8)])
    shapes = Shapes(root=rng.uniform(0, 200), layer=rng.uniform(1, 50), layers=rng.randint(1, 6))
    network = Network.nominal([rng.uniform(10, 1e3), rng.uniform(1, 1e2), rng.uniform(0.1, 10)])
    loads = {"shard": rng.choice([{-1: 1}, {0: 1}, {0: 1, 1: 1}]), "replicate": {0: 1}, "federation": {1: 1}}
    compute = Compute(rng.uniform(0, 5), rng.uniform(0, 10), rng.uniform(0, 4), "test",
                      root_s=rng.choice([None, (0.1, 0.2)]))
    shared = R == 1 or 0 in loads["shard"]
    return step_time(Layout(strategy, F, R, S, A), shapes, FP32, Links(network, loads), compute, gpu,
                     how=Execution(prefetch=prefetch)), shared, compute.optimizer_s / S


@pytest.mark.parametrize("seed", range(40))
def test_the_old_sum_and_max_bound_the_schedule(seed):
    """On GPU the step lies between full overlap (max) and no overlap (sum), prefetched or not, where the shard and
    replicate traffic share their links; where they do not, FSDP2 runs HSDP's all-reduce beside the shard group's
    collectives, which the old max (compute against their sum) did not count, and the step can fall below it, never
    below compute or either kind alone. On CPU, cores not shared, it is the sum."""
    rng = random.Random(seed)
    for prefetch in (True, False):
        t, shared, optimizer = _random_step(random.Random(seed), prefetch)
        assert t.step_s <= t.no_overlap_s * (1 + 1e-9)
        if shared:
            assert t.full_overlap_s * (1 - 1e-9) <= t.step_s
        floor = max(t.compute_s - optimizer, t.comm_s["shard"], t.comm_s["replicate"]) + optimizer \
            + t.comm_s["federation"]  # nothing overlaps the optimizer or the exchange
        assert floor * (1 - 1e-9) <= t.step_s
        assert t.step_s == pytest.approx(t.compute_s + sum(t.exposed_s.values()))
        assert sum(t.exposed_by_level_s.values()) == pytest.approx(sum(t.exposed_s.values()))
    cpu, _, _ = _random_step(rng, True, gpu=False)
    assert cpu.step_s == pytest.approx(cpu.no_overlap_s)


def test_no_overlap_is_reached_without_prefetch_and_full_overlap_with_many_units():
    links = Links(Network.nominal([1e3, 1e2, 1e1]), {"shard": {0: 1}, "replicate": {}, "federation": {}})
    # FSDP without prefetch: every gather issued behind the compute, every backward gather behind the
    # reduce-scatter before it: exactly the sum
    off = step_time(Layout("fsdp", 1, 1, 4), SHAPES, FP32, links, COMPUTE, True, how=Execution(prefetch=False))
    assert off.step_s == pytest.approx(off.no_overlap_s)
    # with prefetch, as the units grow finer, only the first gather and the last reduce-scatter stay exposed:
    # the step tends to the max, whether compute (2 B a layer) or traffic (2 kB a layer) is the longer
    for layer in (2, 2000):
        fine = Shapes(root=0, layer=layer, layers=400)
        t = step_time(Layout("fsdp", 1, 1, 4), fine, FP32, links, COMPUTE, True)
        assert t.full_overlap_s < t.step_s <= t.full_overlap_s * 1.02


def test_cpu_ranks_share_the_cores_of_the_machine_they_run_on(tmp_path):
    """launcher.prediction.Predictor.cores: on cluster=local every rank of the job shares this machine's cores
    (the probe's machine's when it recorded them) and every level is its memory; on the testbed (nodes are network
    namespaces of one machine) too, and its emulated wires are that machine's cores' work as well; compute the
    probe measured was timed by all its ranks at once, an estimate by one alone; GPUs share nothing."""
    from launcher.placement import topology
    from launcher.placement.schedule import NO_WIRE
    from launcher.prediction import Predictor
    from launcher.settings import compose

    topo = topology.ideal(4, [1, 4]).with_bandwidth([1e9, 1e8], "test")
    measured, estimated = Compute(1, 2, 0, "measured by the probe"), Compute(1, 2, 0, "estimated from peak_flops")
    layout = Layout("fsdp", 1, 1, 8)
    for cluster, wire in (("local", NO_WIRE), ("testbed", NO_WIRE)):
        predictor = Predictor(compose(["sweep=smoke", f"cluster={cluster}", f"results_dir={tmp_path}"]), topo)
        predictor.probe = {"hosts": ["n1"] * 4 + ["n2"] * 4, "machine": {"cores": 4, "cores_usable": 2}}
        assert predictor.cores(layout, measured) == Cores(8, 2, 8, 2, wire)
        assert predictor.cores(layout, estimated) == Cores(8, 2, 1, 1, wire)
    gpu = Predictor(compose(["sweep=smoke", "cluster=leonardo", f"results_dir={tmp_path}"]), topo)
    assert gpu.cores(layout, measured) is None



def test_a_federated_layout_between_averages_runs_on_its_ranks_cpu_seconds(tmp_path):
    """launcher.prediction: the probe's in-place stage step is the slowest of the world's ranks, as FSDP and a layout
    averaging every step wait for; between averages no group waits for another, so where ranks share cores the step
    is the mean rank's CPU seconds times ranks per core (8 ranks on 2 cores: 4), when that is shorter; on GPU, and
    with a probe that kept no CPU seconds, the slowest as before."""
    from launcher.placement import topology
    from launcher.prediction import Predictor, Workload, between_averages
    from launcher.settings import compose
    from train.contract.presets import PRESETS

    kwargs = dict(PRESETS["tiny"])  # 2 layers
    measured = {"model": kwargs, "batch_per_rank": 4, "seq_len": 64, "precision": "fp32", "pp": 1, "tp": 2,
                "microbatches": 1, "pp_schedule": "1f1b", "sequence_parallel": False,
                "one": {"forward_s": 0.06, "backward_s": 0.04, "optimizer_s": 0.02},
                "layer": {"forward_s": 0.02, "backward_s": 0.04, "optimizer_s": 0.02},
                "cpu": {"one": 0.025, "layer": 0.015}}
    topo = topology.ideal(4, [1, 4]).with_bandwidth([1e9, 1e8], "test")
    work = Workload(kwargs, 4, 64, "fp32")

    def compute(cluster: str, layout: Layout) -> Compute:
        predictor = Predictor(compose(["sweep=smoke", f"cluster={cluster}", f"results_dir={tmp_path}"]), topo)
        predictor.probe = {"layouts": [measured], "hosts": ["n1"] * 4 + ["n2"] * 4,
                           "machine": {"cores": 2, "cores_usable": 2}}
        c = predictor.compute(layout, work)
        return between_averages(layout, c, predictor.cores(layout, c))

    slowest, shared = 0.08 + 0.08 + 0.04, (0.025 + 0.015) * 8 / 2
    between = compute("local", Layout("fl_fsdp", 4, 1, 1, 8, T=2))
    assert between.forward_s + between.backward_s + between.optimizer_s == pytest.approx(shared)
    assert between.forward_s / between.backward_s == pytest.approx(1.0)  # the phases keep their shares
    for layout in (Layout("fsdp", 1, 1, 4, T=2), Layout("fl_fsdp", 4, 1, 1, 1, T=2)):
        c = compute("local", layout)
        assert c.forward_s + c.backward_s + c.optimizer_s == pytest.approx(slowest)
    gpu = compute("leonardo", Layout("fl_fsdp", 4, 1, 1, 8, T=2))
    assert gpu.forward_s + gpu.backward_s + gpu.optimizer_s == pytest.approx(slowest)
    measured["cpu"] = {"one": 0.05, "layer": 0.05}  # more than the slowest rank's seconds: no core idled
    assert compute("local", Layout("fl_fsdp", 4, 1, 1, 8, T=2)).forward_s == pytest.approx(0.08)
    del measured["cpu"]  # a probe written before the ranks' CPU seconds were kept
    assert compute("local", Layout("fl_fsdp", 4, 1, 1, 8, T=2)).forward_s == pytest.approx(0.08)
