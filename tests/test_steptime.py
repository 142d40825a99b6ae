"""The step-time model: hand-computed steps, its limits (A -> infinity, F = 1), contention, and probe input
(the schedule's own hand-worked cases: tests/test_schedule.py)."""
import pytest

from launcher.placement import topology
from launcher.placement.allocate import assess, place
from launcher.placement.costmodel import Model, llama_params
from launcher.placement.levels import traffic
from launcher.placement.network import Network
from launcher.placement.steptime import (
    Activations,
    Compute,
    Links,
    Shapes,
    load,
    step_time,
)
from tests.support import grid
from train.contract.common import ConfigError
from train.contract.layout import Layout
from train.contract.presets import PRESETS
from train.contract.spec import FEDAVG_CHUNK_BYTES

SHAPES = Shapes(root=100, layer=10, layers=2)  # units: embedding 50, lm_head 50, two layers of 10 parameters
FP32 = Model(params=120, layers=2, bytes_per_param=4)
NOMINAL = Network.nominal([1e3, 1e2, 1e1])     # bytes/s inside a node, under a leaf, across the spine
COMPUTE = Compute(forward_s=1.0, backward_s=2.0, optimizer_s=4.0, source="test")
LEAF = {0: 1}                                   # one group per link, crossing node links under one leaf


def _step(strategy, F, R, S, A, loads, compute=COMPUTE, overlap=False, network=NOMINAL, model=FP32):
    return step_time(Layout(strategy, F, R, S, A), SHAPES, model, Links(network, loads), compute, overlap)


def test_fsdp_step_by_hand():
    # all_gather: the embedding twice (resharded after forward), lm_head once (kept for backward), each layer
    # twice: (2 * 200 + 200 + 2 * 2 * 40) bytes; reduce_scatter: every unit once: 480 bytes; both x (S-1)/S = 3/4,
    # over 100 B/s at the leaf level
    t = _step("fsdp", 1, 1, 4, None, {"shard": LEAF, "replicate": {}, "federation": {}})
    assert t.comm_s["shard"] == pytest.approx((760 + 480) * 0.75 / 100)
    assert t.compute_s == pytest.approx(1 + 2 + 4 / 4)  # the optimizer updates a quarter of the model
    assert t.no_overlap_s == pytest.approx(4 + 9.3)
    assert t.full_overlap_s == pytest.approx(max(3, 9.3) + 1)
    assert t.step_s == t.no_overlap_s  # CPU, cores not shared: every collective blocks, the sum
    # GPU, scheduled (launcher.placement.schedule; tests/test_schedule.py walks smaller cases): the layers' 0.3 s
    # gathers hide behind the 0.5 s forwards and 1 s backwards, the 1.5 s embedding and lm_head traffic does not
    # (nothing to hide it at the ends), and each backward gather queues behind the reduce-scatter issued before it
    # on the same leaf link: forward ends at 3.8 s, backward at 9.5 s, the optimizer takes 1 s
    gpu = _step("fsdp", 1, 1, 4, None, {"shard": LEAF, "replicate": {}, "federation": {}}, overlap=True)
    assert gpu.step_s == pytest.approx(10.5) and t.full_overlap_s < gpu.step_s < t.no_overlap_s
    assert gpu.exposed_s == pytest.approx({"shard": 6.5}) and gpu.exposed_by_level_s == pytest.approx({"leaf": 6.5})


def test_fl_hsdp_step_by_hand():
    loads = {"shard": {-1: 1}, "replicate": {0: 1}, "federation": {1: 1}}
    t = _step("fl_hsdp", 2, 2, 2, 4, loads)
    shard = (760 + 480) * 0.5 / 1e3
    replicate = 480 / 2 * (2 * 1 / 2) / 1e2  # all_reduce of each unit's half, R = 2
    # FedAvg: each replica all-reduces its half of the shard across the spine, then the replicas gather the halves
    federation = (480 / 2 / 2 * 1 / 1e1 + 480 / 2 * (2 - 1) / 2 / 1e2) / 4
    assert t.comm_s == pytest.approx({"shard": shard, "replicate": replicate, "federation": federation})
    assert t.no_overlap_s == pytest.approx(3 + 4 / 2 + shard + replicate + federation)


def test_latency_is_paid_per_collective():
    network = Network({(lv, c): link for (lv, c), link in NOMINAL.links.items()}, "test")
    network.links = {k: type(v)(0.5, v.bytes_per_s) for k, v in network.links.items()}
    loads = {"shard": LEAF, "replicate": {}, "federation": {}}
    no_alpha, alpha = _step("fsdp", 1, 1, 4, None, loads), _step("fsdp", 1, 1, 4, None, loads, network=network)
    assert alpha.comm_s["shard"] - no_alpha.comm_s["shard"] == pytest.approx(0.5 * (7 + 4))  # 7 gathers, 4 reduces


def test_infinite_A_reduces_to_fsdp_and_hsdp():
    """As A grows the FL strategies' step tends to their group's: HSDP's, FSDP's (F = 1 is no layout of theirs)."""
    hsdp_loads = {"shard": {-1: 1}, "replicate": {0: 1}, "federation": {}}
    hsdp = _step("hsdp", 1, 2, 2, None, hsdp_loads)
    far = _step("fl_hsdp", 2, 2, 2, 10**12, {**hsdp_loads, "federation": {1: 1}})
    assert far.step_s == pytest.approx(hsdp.step_s) and far.comm_s["federation"] > 0
    fsdp_loads = {"shard": LEAF, "replicate": {}, "federation": {}}
    fsdp = _step("fsdp", 1, 1, 4, None, fsdp_loads)
    assert _step("fl_fsdp", 2, 1, 4, 10**12, {**fsdp_loads, "federation": {1: 1}}).step_s == pytest.approx(fsdp.step_s)


def test_groups_sharing_a_link_split_its_bandwidth():
    links = Network(NOMINAL.links, "link rates")  # shared: measured link rates, as a probe gives them
    one = _step("fsdp", 1, 1, 4, None, {"shard": {0: 1}, "replicate": {}, "federation": {}}, network=links)
    two = _step("fsdp", 1, 1, 4, None, {"shard": {0: 2}, "replicate": {}, "federation": {}}, network=links)
    assert two.comm_s["shard"] == pytest.approx(2 * one.comm_s["shard"])
    # the busiest link decides: 20 groups on a 100 B/s node link (0.2 s/B) outweigh 1 on a 10 B/s trunk (0.1 s/B)
    both = _step("fsdp", 1, 1, 4, None, {"shard": {0: 20, 1: 1}, "replicate": {}, "federation": {}}, network=links)
    assert both.comm_s["shard"] == pytest.approx(2 * _step("fsdp", 1, 1, 4, None, {
        "shard": {1: 1}, "replicate": {}, "federation": {}}, network=links).comm_s["shard"])
    # nominal bandwidth is each rank's share already (cluster.bandwidth_GBps): flows do not divide it again
    assert _step("fsdp", 1, 1, 4, None, {"shard": {0: 2}, "replicate": {}, "federation": {}}).comm_s["shard"] == \
        pytest.approx(one.comm_s["shard"])


def test_fedavg_counts_one_collective_per_chunk():
    big = Shapes(root=FEDAVG_CHUNK_BYTES // 4, layer=FEDAVG_CHUNK_BYTES // 8, layers=2)  # 2 chunks of fp32
    network = Network({k: type(v)(1.0, 1e18) for k, v in NOMINAL.links.items()}, "latency only")
    t = step_time(Layout("fl_fsdp", 2, 1, 1, 1), big, FP32,
                  Links(network, {"shard": {}, "replicate": {}, "federation": {1: 1}}), None, False)
    assert t.comm_s["federation"] == pytest.approx(2.0, rel=1e-6)
    assert t.compute_s is None and "unknown" in t.compute_source


def test_shapes_add_up_to_the_model():
    for preset in ("mini", "llama3_8b"):
        kwargs = PRESETS[preset]
        shapes = Shapes.of(kwargs)
        keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size")
        assert shapes.root + shapes.layers * shapes.layer == llama_params(**{k: kwargs[k] for k in keys})


def test_compute_estimate_from_peak_flops():
    kwargs = PRESETS["llama3_8b"]
    c = Compute.estimated(kwargs, batch=1, seq_len=1024, peak_flops=312e12)
    params = llama_params(**{k: kwargs[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                    "num_attention_heads", "num_key_value_heads", "intermediate_size")})
    flops = 1024 * (6 * (params - 128256 * 4096) + 12 * 32 * 4096 * 1024)
    assert c.forward_s + c.backward_s == pytest.approx(flops / (312e12 * 0.4))
    assert c.backward_s == pytest.approx(2 * c.forward_s) and "40% MFU" in c.source


def test_probe_links_price_collectives_by_the_flows_sharing_them():
    probe = {"levels": [{"level": "leaf", "collective": c, "alpha_s": 0.001, "link_bytes_per_s": 100.0, "flows": 2}
                        for c in ("all_gather", "reduce_scatter", "all_reduce", "broadcast")]}
    network = Network.from_probe(probe, "probe test")
    assert network.seconds("all_reduce", 100, 2, {0: 1}) == pytest.approx(0.001 + 100 / 100)
    assert network.seconds("all_to_all", 100, 2, {0: 2}) == pytest.approx(0.001 + 100 / 50)  # priced as all_reduce
    with pytest.raises(ConfigError, match="probe test has no all_reduce at level spine"):
        network.seconds("all_reduce", 100, 2, {1: 1})


def _tree():
    return topology.from_json({"parent": {"a1": "leafA", "a2": "leafA", "b1": "leafB", "b2": "leafB",
                                          "leafA": "spine", "leafB": "spine"},
                               "level": {"leafA": 0, "leafB": 0, "spine": 1},
                               "leaves": {"leafA": ["a1", "a2"], "leafB": ["b1", "b2"]},
                               "bandwidth": [1e3, 1e2, 1e1]})


def test_traffic_counts_groups_per_link():
    topo = _tree()
    # one 8-rank ring over both leaves crosses each node link and each trunk once
    assert traffic([["a1", "a1", "a2", "a2", "b1", "b1", "b2", "b2"]], topo) == {0: 1, 1: 1}
    # two FedAvg groups (one per shard index) over the four nodes: both on every link
    assert traffic([["a1", "a2", "b1", "b2"]] * 2, topo) == {0: 2, 1: 2}
    assert traffic([["a1", "a1"], ["a2", "a2"]], topo) == {-1: 1}
    # SLURM's order numbers nodes across the leaves: the same ring crosses each trunk twice each way
    assert traffic([["a1", "a1", "b1", "b1", "a2", "a2", "b2", "b2"]], topo) == {0: 1, 1: 2}
    assert traffic([["a1", "b1", "a2", "b2"]] * 2, topo) == {0: 2, 1: 4}


def test_slurm_rank_order_prices_the_fsdp_ring_over_the_trunk_twice():
    topo = _tree()
    interleaved = assess(grid(1, 1, 8), [h for h in ("a1", "b1", "a2", "b2") for _ in range(2)], topo)
    grouped = assess(grid(1, 1, 8), [h for h in ("a1", "a2", "b1", "b2") for _ in range(2)], topo)
    assert load(interleaved, grid(1, 1, 8), topo)["shard"] == {0: 1, 1: 2}
    assert load(grouped, grid(1, 1, 8), topo)["shard"] == {0: 1, 1: 1}


def test_load_of_placed_layouts():
    topo = _tree()
    fl = place(grid(4, 1, 2), 2, topo)
    assert load(fl, grid(4, 1, 2), topo) == {"shard": {-1: 1}, "replicate": {}, "federation": {0: 2, 1: 2},
                                       "pipeline": {}, "tensor": {}}
    # FL+HSDP (2,2,2): each of the 2 replicas of both shards averages its part across the trunk, 4 pairs at once
    # (train.federation.federated); counting replica 0's 2 alone priced the testbed's FedAvg at half its time
    hsdp = place(grid(2, 2, 2), 2, topo)
    assert load(hsdp, grid(2, 2, 2), topo) == {"shard": {-1: 1}, "replicate": {0: 2}, "federation": {0: 2, 1: 4},
                                         "pipeline": {}, "tensor": {}}
    fsdp = place(grid(1, 1, 8), 2, topo)
    assert load(fsdp, grid(1, 1, 8), topo) == {"shard": {0: 1, 1: 1}, "replicate": {}, "federation": {}, "pipeline": {},
                                         "tensor": {}}


def test_latency_per_ring_step_grows_with_the_communicator():
    link = {("leaf", c): type(NOMINAL.links[("leaf", c)])(0.0, 1e30, 1e-5) for c in ("all_reduce", "all_gather")}
    network = Network(link, "per-step latency")
    assert network.seconds("all_reduce", 1, 8, {0: 1}) == pytest.approx(2 * 7 * 1e-5)
    assert network.seconds("all_gather", 1, 512, {0: 1}) == pytest.approx(511 * 1e-5)


def test_tensor_parallel_step_by_hand():
    # tp = 2: the embedding (50) whole, gathered twice, half of lm_head (25), once; each layer is 5 per rank.
    # Per layer 7 all_reduces of a microbatch's activations (8 tokens x 2 hidden x 4 B = 64 B): 2 in forward, one
    # per column-wise matrix's input gradient in backward; one more for lm_head's input gradient, and the logits
    # gathered (8 x 5 x 4 = 160 B), inside a node (1e3 B/s).
    acts, layout = Activations(microbatches=1, tokens=8, hidden=2, vocab=5), Layout("fsdp", 1, 1, 4, P=1, T=2)
    t = step_time(layout, SHAPES, FP32, Links(NOMINAL, {
        "shard": LEAF, "replicate": {}, "federation": {}, "tensor": {-1: 1}, "pipeline": {}}),
                  COMPUTE, overlap=False, acts=acts)
    assert t.comm_s["tensor"] == pytest.approx(15 * 64 * 1.0 / 1e3 + 160 * 0.5 / 1e3)
    assert t.comm_s["shard"] == pytest.approx(((2 * 50 + 25 + 2 * 2 * 5) * 4 + (75 + 2 * 5) * 4) * 0.75 / 100)
    assert t.compute_s == pytest.approx(3.0 / 2 + 4.0 / (4 * 2))  # forward+backward / tp, optimizer / (S x tp)


def test_sequence_parallel_tensor_step_by_hand():
    # The same tp = 2 layout with sequence parallelism: per layer 4 all_gathers and 2 reduce_scatters of the
    # 64 B activations (each half an all_reduce's ring bytes: 64 x 0.5 / 1e3) and the 5 backward all_reduces,
    # the stage's 2 more all_gathers, lm_head's all_reduce and its logits' gather as before.
    acts = Activations(microbatches=1, tokens=8, hidden=2, vocab=5, sequence_parallel=True)
    layout = Layout("fsdp", 1, 1, 4, P=1, T=2)
    t = step_time(layout, SHAPES, FP32, Links(NOMINAL, {
        "shard": LEAF, "replicate": {}, "federation": {}, "tensor": {-1: 1}, "pipeline": {}}),
                  COMPUTE, overlap=False, acts=acts)
    per_layer = 6 * 64 * 0.5 / 1e3 + 5 * 64 / 1e3
    assert t.comm_s["tensor"] == pytest.approx(2 * per_layer + 2 * 64 * 0.5 / 1e3 + 64 / 1e3 + 160 * 0.5 / 1e3)


def test_pipeline_step_by_hand():
    # pp = 2 with 2 microbatches: 3 slots, each sending a microbatch's activations (4 x 2 x 4 = 32 B) forward
    # and their gradient back across a leaf (100 B/s); compute halved, then stretched by the bubble (2+2-1)/2.
    # No unit reshards after forward under pp: the layer and the embedding are gathered once a step.
    acts, layout = Activations(microbatches=2, tokens=8, hidden=2, vocab=5), Layout("fsdp", 1, 1, 4, P=2, T=1)
    t = step_time(layout, SHAPES, FP32, Links(NOMINAL, {
        "shard": LEAF, "replicate": {}, "federation": {}, "tensor": {}, "pipeline": {0: 1}}),
                  COMPUTE, overlap=True, acts=acts)
    assert t.comm_s["pipeline"] == pytest.approx(2 * 3 * 32 / 100)
    # one layer and the embedding per rank
    assert t.comm_s["shard"] == pytest.approx(((50 + 10) * 4 + (50 + 10) * 4) * 0.75 / 100)
    assert t.compute_s == pytest.approx(3.0 / 2 * 3 / 2 + 4.0 / (4 * 2))
    # nothing overlaps the pipeline's sends, even with FSDP's traffic hidden behind compute
    assert t.full_overlap_s == pytest.approx(max(3.0 / 2 * 3 / 2, t.comm_s["shard"]) + 4.0 / 8 + t.comm_s["pipeline"])


def test_a_stage_step_measured_in_place_replaces_the_priced_parts():
    # The same pp = 2 layout with its stage step measured (train.measure.calibrate_layout): forward + backward as
    # measured, already split, with the bubble and the pipeline's sends in it; the optimizer on the rank's 1/S; FSDP's
    # traffic on the shrunken units priced as before.
    acts, layout = Activations(microbatches=2, tokens=8, hidden=2, vocab=5), Layout("fsdp", 1, 1, 4, P=2, T=1)
    stage = Compute(forward_s=0.75, backward_s=0.0, optimizer_s=2.0, source="in place", in_place=True)
    loads = {"shard": LEAF, "replicate": {}, "federation": {}, "tensor": {}, "pipeline": {0: 1}}
    t = step_time(layout, SHAPES, FP32, Links(NOMINAL, loads), stage, overlap=False, acts=acts)
    priced = step_time(layout, SHAPES, FP32, Links(NOMINAL, loads), COMPUTE, overlap=False, acts=acts)
    assert "pipeline" not in t.comm_s and t.comm_s["shard"] == priced.comm_s["shard"]
    assert t.compute_s == pytest.approx(0.75 + 2.0 / 4) and t.compute_source == "in place"
    assert t.no_overlap_s == pytest.approx(0.75 + 2.0 / 4 + t.comm_s["shard"])
