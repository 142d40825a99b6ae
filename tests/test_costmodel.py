"""The cost model must reproduce the paper's five formulas, their limits, and a sane ranking on a paper-like machine."""
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.placement import topology
from launcher.placement.costmodel import Model, comm_time, llama_params, model_from_preset, predict
from launcher.placement.ranking import candidates, rank_layouts
from train.contract.common import ConfigError, SpecError
from train.contract.layout import Layout

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, intermediate_size=14336, rope_theta=500000.0, tie_word_embeddings=False)
GB = Model(params=500_000_000, layers=10, bytes_per_param=2)  # M*L = 1e9 bytes
BW = dict(B_S=1e11, B_R=1e10, B_F=1e9)


@pytest.mark.parametrize("shape,params", [
    ((128256, 4096, 32, 32, 8, 14336), 8_030_261_248),
    ((512, 64, 2, 4, 2, 128), 139_584),
    ((4096, 256, 4, 8, 4, 704), 5_048_576),
])
def test_llama_params_match_hf(shape, params):
    assert llama_params(*shape) == params


def test_tied_embeddings_drop_lm_head():
    assert llama_params(512, 64, 2, 4, 2, 128, tie_word_embeddings=True) == 139_584 - 512 * 64


def test_model_from_preset_ignores_other_keys_and_picks_comm_bytes():
    bf16 = model_from_preset(LLAMA3_8B, "paper")
    assert (bf16.params, bf16.layers, bf16.bytes) == (8_030_261_248, 32, 2 * 8_030_261_248)
    mixed = model_from_preset(LLAMA3_8B, "bf16")  # bf16 all-gathers; fp32 gradients and master weights
    assert (mixed.bytes, mixed.grad_bytes, mixed.fedavg_bytes) == (2 * mixed.params, 4 * mixed.params, 4 * mixed.params)
    fp32 = model_from_preset(LLAMA3_8B, "fp32")
    assert (fp32.bytes, fp32.grad_bytes, fp32.fedavg_bytes) == (4 * fp32.params,) * 3
    assert (bf16.grad_bytes, bf16.fedavg_bytes) == (bf16.bytes, bf16.bytes)
    assert model_from_preset(LLAMA3_8B, "paper", average_optimizer_state=True).fedavg_bytes == 3 * bf16.bytes
    # compressed pseudo-gradients (train.federation.compress): what crosses the federation links, whatever the precision
    int8 = model_from_preset(LLAMA3_8B, "fp32", aggregation_dtype="int8")
    assert int8.fedavg_bytes == pytest.approx(fp32.params * (1 + 4 / 64)) and int8.bytes == fp32.bytes
    assert model_from_preset(LLAMA3_8B, "fp32", aggregation_dtype="bf16").fedavg_bytes == 2 * fp32.params
    with pytest.raises(ValueError, match="hidden_size"):
        model_from_preset({k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}, "fp32")


@pytest.mark.parametrize("strategy,F,R,S,A,expected", [
    ("fsdp", 1, 1, 4, None, 1e9 * 3 * 3 / 4 / 1e11),
    ("hsdp", 1, 2, 4, None, 1e9 * (3 * 3 / 4 / 1e11 + 2 * 1 / 2 / 1e10)),
    ("fl_fsdp", 8, 1, 4, 2, 1e9 * (3 * 3 / 4 / 1e11 + 0.5 * 2 * 7 / 8 / 1e9)),
    ("fl_hsdp", 8, 2, 4, 2, 1e9 * (3 * 3 / 4 / 1e11 + 2 * 1 / 2 / 1e10 + 0.5 * (2 * 7 / 8 / 1e9 + 1 / 1e10))),
])
def test_hand_computed(strategy, F, R, S, A, expected):
    assert comm_time(Layout(strategy, F, R, S, A), GB, **BW) == pytest.approx(expected, rel=1e-12)


def test_each_collective_is_priced_at_its_own_bytes():
    """bf16 all-gathers with fp32 gradient reduction and fp32 FedAvg: 2, 4, 4 bytes per parameter."""
    mixed = Model(params=500_000_000, layers=10, bytes_per_param=2, grad_bytes_per_param=4, fedavg_bytes_per_param=4)
    terms = predict(Layout("fl_hsdp", 8, 2, 4, 2), mixed, BW)["terms"]
    P = 500_000_000
    assert terms == pytest.approx({"shard": P * (2 * 2 + 4) * 3 / 4 / 1e11, "replicate": P * 4 * 2 * 1 / 2 / 1e10,
                                   "federation": P * 4 * 0.5 * (2 * 7 / 8 / 1e9 + 1 / 1e10)}, rel=1e-12)


def test_predict_splits_terms():
    out = predict(Layout("fl_hsdp", 8, 2, 4, 2), GB, BW)
    assert out["terms"] == pytest.approx({"shard": 0.0225, "replicate": 0.1, "federation": 0.5 * (1.75 + 0.1)})
    assert out["predicted_comm_s"] == pytest.approx(sum(out["terms"].values()))


def test_size_one_groups_cost_nothing_and_need_no_bandwidth():
    assert comm_time(Layout("fsdp", 1, 1, 1, None), GB, None, None, None) == 0
    assert comm_time(Layout("hsdp", 1, 3, 1, None), GB, None, 1e10, None) == pytest.approx(1e9 * 2 * 2 / 3 / 1e10)
    # R = 1 in fl_hsdp also drops the broadcast to the other replicas.
    assert comm_time(Layout("fl_hsdp", 4, 1, 4, 8), GB, **BW) == comm_time(Layout("fl_fsdp", 4, 1, 4, 8), GB, **BW)
    assert predict(Layout("fl_fsdp", 4, 1, 4, 8), GB, {"B_S": 1e11, "B_F": 1e9})["terms"]["replicate"] == 0


@pytest.mark.parametrize("R", [1, 4])
def test_large_A_tends_to_no_federation(R):
    fl = comm_time(Layout("fl_hsdp", 16, R, 4, 10**12), GB, **BW)
    assert fl == pytest.approx(comm_time(Layout("hsdp", 1, R, 4, None), GB, **BW), rel=1e-9)
    if R == 1:
        assert comm_time(Layout("fl_fsdp", 16, 1, 4, 10**12), GB, **BW) == pytest.approx(
            comm_time(Layout("fsdp", 1, 1, 4, None), GB, **BW), rel=1e-9)


def test_infinite_A_is_fsdp_or_hsdp():
    """F = 1 is no FL layout (Layout refuses it); as A grows, FL's communication tends to its groups'."""
    far = 10**15
    assert comm_time(Layout("fl_fsdp", 2, 1, 4, far), GB, **BW) == pytest.approx(
        comm_time(Layout("fsdp", 1, 1, 4, None), GB, **BW))
    assert comm_time(Layout("fl_hsdp", 2, 8, 4, far), GB, **BW) == pytest.approx(
        comm_time(Layout("hsdp", 1, 8, 4, None), GB, **BW))


sizes = st.integers(1, 64)
bandwidths = st.floats(1e6, 1e12)


@given(F=st.integers(2, 64), R=sizes, S=sizes, A=st.integers(1, 1000), dA=st.integers(0, 1000),
       bw=st.tuples(bandwidths, bandwidths, bandwidths), which=st.integers(0, 2), factor=st.floats(1, 100))
def test_monotone_in_A_and_bandwidth(F, R, S, A, dA, bw, which, factor):
    base = comm_time(Layout("fl_hsdp", F, R, S, A), GB, *bw)
    assert comm_time(Layout("fl_hsdp", F, R, S, A + dA), GB, *bw) <= base
    faster = list(bw)
    faster[which] *= factor
    assert comm_time(Layout("fl_hsdp", F, R, S, A), GB, *faster) <= base


@pytest.mark.parametrize("args,says", [
    (("ddp", 1, 1, 4, None), "unknown strategy 'ddp'"),
    (("fsdp", 1, 1, 0, None), "S must be a positive integer"),
    (("fl_fsdp", 0, 1, 4, 8), "F must be a positive integer"),
    (("fsdp", 1, 2, 4, None), "fsdp needs F = 1 and R = 1"),
    (("hsdp", 2, 2, 4, None), "hsdp needs F = 1"),
    (("fl_fsdp", 4, 1, 4, 0), "A (aggregation period in steps) must be an integer >= 1"),
    (("fl_hsdp", 4, 2, 4, None), "A (aggregation period in steps) must be an integer >= 1"),
    (("fl_fsdp", 1, 1, 4, 8), "fl_fsdp needs F >= 2"),
])
def test_a_layout_the_cost_model_cannot_price_cannot_be_made(args, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        Layout(*args)


@pytest.mark.parametrize("args,key", [
    (("fsdp", 1, 1, 4, None, GB, None, None, None), "B_S"),
    (("hsdp", 1, 2, 4, None, GB, 1e11, 0, None), "B_R"),
    (("fl_fsdp", 4, 1, 4, 8, GB, 1e11, None, -1.0), "B_F"),
])
def test_bad_bandwidths_name_the_key(args, key):
    with pytest.raises(ValueError, match=rf"^{key}\b"):
        comm_time(Layout(*args[:5]), *args[5:])


def test_predict_reports_missing_bandwidth_key():
    with pytest.raises(ValueError, match="^B_F"):
        predict(Layout("fl_fsdp", 4, 1, 4, 8), GB, {"B_S": 1e11})


def test_rank_layouts_on_a_paper_like_machine():
    model = model_from_preset(LLAMA3_8B, "paper")
    topo = topology.ideal(128, [1, 16, 128]).with_bandwidth([600e9, 25e9, 12.5e9], "bw")
    rows = rank_layouts(candidates(128, 4), 4, model, topo)
    fsdp = next(r for r in rows if r["strategy"] == "fsdp")
    assert (fsdp["F"], fsdp["R"], fsdp["S"], fsdp["ratio_to_fsdp"]) == (1, 1, 512, 1.0)
    assert fsdp["B_S"] == 12.5e9 and fsdp["B_R"] is None and fsdp["B_F"] is None
    times = [r["predicted_comm_s"] for r in rows]
    assert times == sorted(times)
    for strategy in ("fl_fsdp", "fl_hsdp"):
        for row in (r for r in rows if r["strategy"] == strategy and r["A"] >= 8):
            assert row["ratio_to_fsdp"] < 1 and rows.index(row) < rows.index(fsdp)
    # The paper's FL+HSDP layout: shards on NVLink, 8-node replicas under one leaf, federation machine-wide.
    paper = next(r for r in rows if (r["strategy"], r["F"], r["R"], r["S"], r["A"]) == ("fl_hsdp", 16, 8, 4, 8))
    assert (paper["B_S"], paper["B_R"], paper["B_F"]) == (600e9, 25e9, 12.5e9)
    expected = model.bytes * (9 / 4 / 600e9 + 2 * 7 / 8 / 25e9 + (2 * 15 / 16 / 12.5e9 + 1 / 25e9) / 8)
    assert paper["predicted_comm_s"] == pytest.approx(expected, rel=1e-12)
    fl_hsdp_F = {r["F"] for r in rows if r["strategy"] == "fl_hsdp"}
    assert fl_hsdp_F == {2, 4, 8, 16, 32, 64}
    assert len(rows) == 1 + 1 + 6 + 6 * 6


def test_ideal_tree_and_bandwidth_are_validated():
    with pytest.raises(ConfigError, match="bw needs 3 values"):
        topology.ideal(32, [1, 16]).with_bandwidth([600e9, 25e9], "bw")
    with pytest.raises(ConfigError, match="not increase with level"):
        topology.ideal(16, [1, 16]).with_bandwidth([25e9, 600e9], "bw")
    with pytest.raises(ConfigError, match="nodes_per_level"):
        topology.ideal(16, [1, 6, 16])
