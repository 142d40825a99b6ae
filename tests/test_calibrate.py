"""Compute calibration: repeated, reported as medians with their spread, and never clamped silently."""
import statistics

import pytest

from tests.support import run_ranks

TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}
WORKLOAD = {"model": TINY, "batch_per_rank": 2, "seq_len": 16, "precision": "fp32"}


def _calibrate(rank, world):
    from train.measure.calibrate import calibrate

    return calibrate(rank, [WORKLOAD], iters=2, repeats=5)


def test_calibration_is_repeated_and_reports_medians_and_spread():
    results = run_ranks(_calibrate, 2)
    assert results[0] == results[1]  # the slowest rank's numbers, everywhere
    [w] = results[0]
    assert len(w["repeats"]) == 5
    for part in ("root", "layer"):
        for phase, value in w[part].items():
            assert value == statistics.median(r[part][phase] for r in w["repeats"])
            assert all(r[part][phase] > 0 for r in w["repeats"])  # nothing clamped: every part measured positive
    whole = [r["root"]["forward_s"] + r["root"]["backward_s"] + 3 * (r["layer"]["forward_s"] + r["layer"]["backward_s"])
             for r in w["repeats"]]
    assert w["spread"]["forward_backward"] == pytest.approx((max(whole) - min(whole)) / 2 / statistics.median(whole))


def _scripted(rank, world, script):
    """calibrate with _time_pair replaced by scripted (0-layer, 1-layer) timings, one pair per try; the models
    have 50 and 100 parameters (root 50, layer 50)."""
    from train.measure import calibrate as cal

    timings = iter(script)
    cal._time_pair = lambda model, *a: ((next(timings), 50), (next(timings), 100))
    try:
        return cal.calibrate(rank, [WORKLOAD], repeats=1, tries=3)
    except cal.CalibrationError as exc:
        return str(exc)


def test_a_non_positive_part_is_measured_again_then_refused():
    good = ([2.0, 4.0, 0.5], [3.0, 6.0, 1.0])  # root 2/4, layer 1/2; optimizer 1.5 s / 150 parameters
    flat = ([2.0, 4.0, 0.5], [2.0, 6.0, 1.0])  # the 1-layer forward no slower than the root alone: layer 0
    [[w]] = run_ranks(_scripted, 1, [*flat, *good])
    assert w["layer"] == {"forward_s": 1.0, "backward_s": 2.0, "optimizer_s": pytest.approx(0.5)}
    assert w["root"] == {"forward_s": 2.0, "backward_s": 4.0, "optimizer_s": pytest.approx(0.5)}
    noisy = ([2.0, 4.0, 0.5], [3.0, 6.0, 0.4])  # optimizer by parameter count: never negative from noise
    [[w]] = run_ranks(_scripted, 1, [*noisy])
    assert w["layer"]["optimizer_s"] == pytest.approx(0.9 / 150 * 50)
    [error] = run_ranks(_scripted, 1, [*flat, *flat, *flat])
    assert error.startswith("probe: compute of 2x16 tokens (fp32): the forward or backward of the 1-layer model was "
                            "not slower than the 0-layer model's in 3 tries")


def _steps_in_turn(rank, world):
    """The order in which _time_pair steps its two models (by layer count), with _step recording it, and whether
    each model is sharded as training shards it (root and every layer an FSDP2 module)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from train.measure import calibrate as cal

    order, sharded = [], []

    def step(model, *a):
        order.append(model.config.num_hidden_layers)
        sharded.append(isinstance(model, FSDPModule) and all(isinstance(m, FSDPModule) for m in model.model.layers))
        return 0.01, 0.02, 0.005
    cal._step = step
    cal._time_pair(TINY, 2, 16, "fp32", "cpu", 4, init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))["b"])
    return order, all(sharded)


def test_the_two_models_step_in_turn():
    """A load that passes while one model is timed falls on the other too, so the layer (their difference) keeps
    its sign: the 0- and 1-layer models alternate step by step after one warm-up step each."""
    [(order, sharded)] = run_ranks(_steps_in_turn, 1)
    assert sharded  # FSDP2's hooks and the DTensor optimizer are in the calibrated times
    assert order[:2] == [0, 1] and order[2:] == [0, 1] * ((len(order) - 2) // 2) and len(order) >= 10


LAYOUT = {**WORKLOAD, "batch_per_rank": 4, "pp": 2, "tp": 2, "microbatches": 2, "pp_schedule": "gpipe",
          "sequence_parallel": False}


def _layouts(rank, world):
    from train.measure.calibrate_layout import calibrate_layouts

    return calibrate_layouts(rank, [LAYOUT, {**LAYOUT, "pp": 3, "tp": 1, "microbatches": 3}], iters=2, repeats=3)


@pytest.mark.slow
def test_a_layout_is_measured_in_place_and_one_the_ranks_cannot_hold_is_skipped():
    """4 gloo ranks time the pp = 2 x tp = 2 stage step (gpipe, 2 microbatches); pp = 3 does not divide them."""
    results = run_ranks(_layouts, 4)
    assert all(r == results[0] for r in results)  # the slowest rank's numbers, everywhere
    [w] = results[0]
    assert {k: w[k] for k in LAYOUT} == LAYOUT and len(w["repeats"]) == 3
    assert w["one"]["backward_s"] == 0 and w["layer"]["backward_s"] == 0  # the schedule's step counts as forward
    assert w["one"]["forward_s"] > 0 and w["layer"]["forward_s"] > 0
    assert w["one"]["optimizer_s"] > 0 and w["layer"]["optimizer_s"] > 0
    for part in ("one", "layer"):
        assert w[part]["forward_s"] == statistics.median(r[part]["forward_s"] for r in w["repeats"])


def _stage_of(rank, world):
    """Whether the timed stage is parallelised as training parallelises it: a pipeline over 2 stages of
    tensor-parallel DTensors, sharded by FSDP2 on its own one-rank group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from train.measure.calibrate_layout import _Stage

    mesh = init_device_mesh("cpu", (1, 1, 2, 2), mesh_dim_names=("calibrating", "alone", "pp", "tp"))
    stage = _Stage(LAYOUT, 2, mesh, "cpu")
    q = stage.model.model.layers[str(2 * (rank // 2))].self_attn.q_proj.weight
    return (stage.pipeline is not None, isinstance(stage.model, FSDPModule), isinstance(q, DTensor),
            tuple(q.device_mesh.mesh_dim_names), len(stage.model.model.layers), stage.step()[0] > 0)


def test_the_timed_stage_is_parallelised_as_training_parallelises_it():
    for pipelined, sharded, dtensor, dims, layers, timed in run_ranks(_stage_of, 4):
        assert pipelined and sharded and dtensor and timed
        assert set(dims) == {"alone", "tp"} and layers == 2  # 2 layers per stage of the 4-layer model


def _scripted_layout(rank, world, script):
    """calibrate_layouts with in_turn replaced by scripted (1-layer, 2-layer) stage timings, one pair per try."""
    from train.measure import calibrate_layout as cal
    from train.measure.calibrate import CalibrationError

    timings = iter(script)
    cal.in_turn = lambda steps, *a: [next(timings), next(timings)]
    try:
        return cal.calibrate_layouts(rank, [{**LAYOUT, "pp": 1, "tp": 1, "microbatches": 1}], repeats=1, tries=3)
    except CalibrationError as exc:
        return str(exc)


def test_a_layout_whose_further_layer_costs_nothing_is_measured_again_then_refused():
    good = ([2.0, 4.0, 0.5], [3.0, 6.0, 1.0])
    flat = ([2.0, 4.0, 0.5], [2.5, 3.5, 1.0])  # forward + backward of the second layer: 0
    [[w]] = run_ranks(_scripted_layout, 1, [*flat, *good])
    assert (w["one"]["forward_s"], w["one"]["backward_s"]) == (2.0, 4.0)
    assert (w["layer"]["forward_s"], w["layer"]["backward_s"]) == (1.0, 2.0)
    [error] = run_ranks(_scripted_layout, 1, [*flat, *flat, *flat])
    assert error.startswith("probe: compute of layout pp=1 tp=1 at 4x16 tokens: a stage of 2 layers was not slower "
                            "than one of 1 in 3 tries")
