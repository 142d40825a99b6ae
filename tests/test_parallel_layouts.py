"""Tensor and pipeline parallelism in the launcher: sweep axes, run ids, placement (a tensor-parallel group inside
a node, pipeline stages next), plan.json's fields, the ranking over pp x tp, and the memory model's shape
(its agreement with measured peaks: tests/test_memory.py). Training with them: tests/test_model_parallel.py."""
import json
from dataclasses import replace

from launcher.actions.plan import plan
from launcher.placement import memory
from launcher.placement.steptime import Shapes
from launcher.settings import compose
from launcher.sweep import expand
from train.contract.layout import Layout
from train.contract.presets import PRESETS


def _settings(tmp_path, *overrides):
    return compose(["sweep=paper_table3", "cluster=leonardo", f"results_dir={tmp_path}", *overrides])


def test_sweep_axes_give_the_layouts_on_the_same_devices(tmp_path):
    runs = expand(_settings(tmp_path, "sweep.tp=[1,2]", "sweep.pp=[1,4]"))
    by_id = {r.run_id: r for r in runs}
    # 512 GPUs of 4 per node: a shard of pp x tp GPUs leaves 4 / (pp x tp) shards per node, or spans nodes
    assert {"fsdp-F1-R1-S512", "fsdp-F1-R1-S256-T2", "fsdp-F1-R1-S128-P4", "fsdp-F1-R1-S64-P4-T2",
            "fl_hsdp-F16-R8-S1-A8-P4", "fl_fsdp-F64-R1-S1-A8-P4-T2"} <= set(by_id)
    assert all(r.spec.world_size == 512 and r.nodes == 128 for r in runs)
    assert (by_id["fsdp-F1-R1-S64-P4-T2"].spec.layout.T, by_id["fsdp-F1-R1-S64-P4-T2"].spec.layout.P) == (2, 4)
    excluded = expand(_settings(tmp_path, "sweep.tp=[1,2]", "+sweep.exclude=[{tp: 2}]"))
    assert all(r.spec.layout.T == 1 for r in excluded)


def test_plan_places_tensor_groups_in_a_node_and_stages_next(tmp_path):
    settings = _settings(tmp_path, "sweep.strategies=[fl_hsdp]", "sweep.tp=[2]", "sweep.pp=[4]")
    (planned,), _ = plan(settings, echo=False)
    entry = json.loads((tmp_path / "leonardo" / "paper_table3" / "plan.json").read_text())["runs"][0]
    assert entry["run_id"] == "fl_hsdp-F16-R4-S1-A8-P4-T2" and (entry["tp"], entry["pp"]) == (2, 4)
    coords = entry["coords"]
    assert coords[:5] == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 0, 0, 2, 0]]
    hosts = entry["hostfile"]
    for rank in range(0, 512, 2):  # each tensor-parallel pair on one node
        assert hosts[rank] == hosts[rank + 1]
    b = entry["bandwidth"]
    # the pipeline of 8 GPUs spans two nodes under one L1 switch; replicas and groups cross higher levels
    assert b["B_T"] == 200e9 and b["B_P"] == 12.5e9 and b["B_S"] is None and entry["hierarchy_ok"]
    assert b["B_T"] >= b["B_P"] >= b["B_R"] >= b["B_F"]
    assert entry["predicted_comm_by_group_s"]["tensor"] > 0 and entry["predicted_comm_by_group_s"]["pipeline"] > 0
    assert 0 < entry["memory_per_device"]["total"] < 68.7e9


def test_ranking_tries_tensor_and_pipeline_degrees_and_marks_what_does_not_fit(tmp_path):
    plan(_settings(tmp_path, "cluster.gpu_memory_GB=50"), echo=False)
    ranking = json.loads((tmp_path / "leonardo" / "paper_table3" / "plan.json").read_text())["ranking"]
    assert {(row["pp"], row["tp"]) for row in ranking} == {(p, t) for p in (1, 2, 4, 8) for t in (1, 2, 4)}
    fits = [row["fits"] for row in ranking]
    assert True in fits and False in fits and fits == sorted(fits, reverse=True)  # what fits comes first
    assert all(row["memory_per_device_bytes"] <= 50e9 for row in ranking if row["fits"])
    # ranking.md: every ranked layout, in the same order, with its step and memory per device
    table = (tmp_path / "leonardo" / "paper_table3" / "ranking.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(ranking) and table[0] == "# Every layout on 128 nodes of 4 GPUs, fastest first"
    first, last = rows[0].split(" | "), rows[-1].split(" | ")
    assert first[1:8] == [str(ranking[0][k] or "-") for k in ("strategy", "F", "R", "S", "A", "pp", "tp")]
    assert float(first[8]) == float(f"{ranking[0]['predicted_step_s']:.4g}") and first[-1] == "yes |"
    assert last[-1] == "**no** |" and last[-2].endswith("GB")


def test_memory_model_moves_as_the_layout_says():
    llama = PRESETS["llama3_8b"]
    base = memory.DeviceWork(Layout("fsdp", 1, 1, 8), batch=2, seq_len=2048, precision="paper")
    plain = memory.per_device(llama, base)
    tp = memory.per_device(llama, replace(base, layout=Layout("fsdp", 1, 1, 8, T=2)))
    assert tp.state < plain.state and tp.activations < plain.activations
    gpipe = memory.per_device(llama, replace(base, layout=Layout("fsdp", 1, 1, 8, P=4), microbatches=8,
                                             schedule="gpipe"))
    one_f_one_b = memory.per_device(llama, replace(base, layout=Layout("fsdp", 1, 1, 8, P=4), microbatches=8))
    assert one_f_one_b.activations < gpipe.activations  # 1F1B holds at most pp microbatches
    checkpointed = memory.per_device(llama, replace(base, checkpointing="full"))
    assert checkpointed.activations < plain.activations / 4  # what is left is mostly the loss over 128k logits
    # parameters + AdamW moments in bf16 over 8 shards, gradients freed before the activation peak
    assert plain.state == (Shapes.of(llama).root + 32 * Shapes.of(llama).layer) / 8 * 6
