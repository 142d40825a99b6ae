"""The dry-run (train.job.dryrun, launcher.actions.dryrun): a run's own code on fake tensors at its real world size
measures the memory and issues the collectives that the same code holds and issues on real tensors and gloo ranks."""
import json

import pytest

from launcher.__main__ import main
from launcher.actions.dryrun import sent_bytes, traffic
from launcher.planning import model_sent_bytes
from launcher.sweep import Run
from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.job.dryrun import DryRunError, Watch, dryrun, exercise, group_names, report

TINY = {"preset": "tiny"}
CASES = {  # (spec, rank played): the four strategies, tp 2, pp 2 (both ends), DiLoCo, int8, 16-bit parameters
    "fsdp": ({"strategy": "fsdp", "F": 1, "R": 1, "S": 4}, 0),
    "hsdp": ({"strategy": "hsdp", "F": 1, "R": 2, "S": 2}, 0),
    "fl_fsdp": ({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 4}, 0),
    "fl_hsdp": ({"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 2, "A": 4}, 0),
    "tp2": ({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 4, "train": {"tp": 2}}, 0),
    "pp2_first": ({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "train": {"pp": 2}}, 0),
    "pp2_last": ({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "train": {"pp": 2}}, 3),
    "diloco_int8": ({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 4,
                     "train": {"outer": "diloco", "aggregation_dtype": "int8"}}, 0),
    "paper_bf16": ({"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 4, "train": {"precision": "paper"}}, 0),
    "selective_checkpointing": ({"strategy": "fsdp", "F": 1, "R": 1, "S": 4,
                                 "train": {"activation_checkpointing": "selective"}}, 0),
}


def _spec(raw: dict, tmp_path) -> dict:
    return {**raw, "model": TINY, "out_dir": str(tmp_path)}


def _real_rank(rank: int, world: int, raw: dict) -> dict:
    from train.loop import Trainer

    spec = RunSpec.from_dict(raw)
    trainer = Trainer(spec, rank, "cpu")
    watch = Watch(group_names(trainer.mesh), fake=False)
    return report(spec, rank, exercise(trainer, watch), watch, 0.0)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_the_dry_run_measures_what_the_real_run_holds_and_issues(case, tmp_path):
    raw, rank = CASES[case]
    raw = _spec(raw, tmp_path)
    real = run_ranks(_real_rank, RunSpec.from_dict(raw).world_size, raw)[rank]
    fake = dryrun(RunSpec.from_dict(raw), rank)
    assert fake["peak_bytes"].keys() == real["peak_bytes"].keys()
    for phase, measured in real["peak_bytes"].items():
        assert fake["peak_bytes"][phase] == pytest.approx(measured, rel=0.05), phase
    assert fake["collectives"] == real["collectives"]
    assert "_scaled_dot_product_flash_attention_for_cpu" in fake["attention"]  # no score matrix kept
    _model_sends_what_the_dry_run_sent(RunSpec.from_dict(raw), fake)


def _model_sends_what_the_dry_run_sent(spec: RunSpec, played: dict) -> None:
    """The step-time model's bytes per group, per step and per aggregation, are the dry-run's within 2 %
    (int8 blocks' scales, FSDP's padding to a multiple of S) or 64 B."""
    sides = traffic(sent_bytes(played, spec), model_sent_bytes(Run(spec, 1)))
    assert sides["step"]
    for per, groups in sides.items():
        for group, sent in groups.items():
            assert sent["dryrun"] == pytest.approx(sent["model"], rel=0.02, abs=64), (per, group)


def _step_calls(raw: dict, tmp_path, rank: int = 0) -> dict[str, int]:
    played = dryrun(RunSpec.from_dict(_spec(raw, tmp_path)), rank)
    return {c["op"]: c["count"] for c in played["collectives"]["step"] if c["group"] == "shard"}


def test_fsdp_units_are_torchtitans(tmp_path):
    """train.parallel.parallelize.shard, counted by the dry-run: the embedding gathered in forward and again in
    backward, each layer likewise, lm_head and the root (the final norm) once, as backward needs them first; one
    reduce-scatter each. Under pp no unit is resharded after forward: one gather each a step, whatever the
    microbatches (the tiny preset: 2 layers)."""
    layers = 2
    assert _step_calls({"strategy": "fsdp", "F": 1, "R": 1, "S": 4}, tmp_path) == {
        "_allgather_base_": 2 + 2 * layers + 1 + 1, "_reduce_scatter_base_": layers + 3}
    pp = {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "train": {"pp": 2, "microbatches": 4, "batch_per_rank": 4}}
    assert _step_calls(pp, tmp_path, rank=0) == {"_allgather_base_": 1 + 1, "_reduce_scatter_base_": 1 + 1}  # first
    assert _step_calls(pp, tmp_path, rank=3) == {"_allgather_base_": 1 + 1 + 1,                          # last
                                                 "_reduce_scatter_base_": 1 + 1 + 1}


def test_the_model_prices_the_tensor_and_pipeline_traffic_sequence_parallelism_issues(tmp_path):
    raw = _spec({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "train": {"tp": 2, "pp": 2, "sequence_parallel": True,
                                                                        "microbatches": 4, "batch_per_rank": 4}},
                tmp_path)
    played = dryrun(RunSpec.from_dict(raw))
    assert {"tp", "pp", "shard"} <= set(sent_bytes(played, RunSpec.from_dict(raw))["step"])
    _model_sends_what_the_dry_run_sent(RunSpec.from_dict(raw), played)


def test_the_collectives_are_named_by_the_mesh_dimensions_they_span(tmp_path):
    """FL+HSDP: gradients reduce-scatter over the shard group and all-reduce over replicas every step; only the
    aggregation crosses federation groups, and nothing in a step spans the world (no barrier: phases are timed
    with events)."""
    got = dryrun(RunSpec.from_dict(_spec(CASES["fl_hsdp"][0], tmp_path)))["collectives"]
    step = {(c["op"], c["group"]) for c in got["step"]}
    assert {("_allgather_base_", "shard"), ("_reduce_scatter_base_", "shard"), ("allreduce_", "replicate")} <= step
    assert not any("fed" in group or op == "barrier" for op, group in step)
    assert ("allreduce_", "fed") in {(c["op"], c["group"]) for c in got["aggregation"]}


def test_a_host_sync_in_a_step_ends_the_dry_run_naming_the_call(tmp_path):
    raw = _spec({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "train": {"on_nonfinite": "skip_step"}}, tmp_path)
    with pytest.raises(DryRunError, match=r"host sync in a training step: nonfinite.py:\d+ \(return bool\(bad.item"):
        dryrun(RunSpec.from_dict(raw))


def test_a_step_that_aggregates_reads_nothing_and_its_replicas_gather_their_shares(tmp_path):
    """A = 1: every step averages and reads nothing on the host (the dry-run refuses a read in the step it plays).
    FL+HSDP: each replica averages its 1/R of the buffer across the groups, then the replicas all_gather the
    pieces: per event the replicate group carries (R - 1)/R of the buffer (a broadcast carried all of it) and the
    fed group 1/R of what replica 0 alone sent before."""
    raw = _spec({"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 1}, tmp_path)
    spec = RunSpec.from_dict(raw)
    played = dryrun(spec)
    assert played["host_syncs"].get("step", 0) == 0
    aggregation = {(c["op"], c["group"]) for c in played["collectives"]["aggregation"]}
    assert ("allreduce_", "fed") in aggregation and not any(op.startswith("broadcast") for op, _ in aggregation)
    sent = sent_bytes(played, spec)["aggregation"]
    buffer = sent["fed"] / (2 * (2 - 1) / 2) * 2  # the fed group's ring all_reduce moves 2 (F-1)/F of 1/R of it
    assert sent["replicate"] == pytest.approx(buffer * (2 - 1) / 2, rel=0.01)


def _launch(tmp_path, repeats: int, *extra) -> int:
    return main(["sweep=smoke", "action=dryrun", f"results_dir={tmp_path}", f"sweep.repeats={repeats}", *extra])


@pytest.mark.slow
def test_action_dryrun_writes_measured_memory_and_collectives_sharing_runs_of_the_same_work(tmp_path, capsys):
    assert _launch(tmp_path, 2) == 0
    out = capsys.readouterr().out
    sweep = tmp_path / "local" / "smoke"
    plan = json.loads((sweep / "plan.json").read_text())
    played = json.loads((sweep / "dryrun.json").read_text())
    assert len(plan["runs"]) == 4 and out.count("  dry-run ") == 2  # the repeats share their first one's
    for run in plan["runs"]:
        memory = run["memory"]
        assert memory["dryrun_peak_bytes"] > 0 and memory["dryrun_after_training_bytes"] > 0
        assert memory["model_bytes"] == int(run["memory_per_device"]["total"])
        source = played[run["run_id"]]["played_as"]
        assert source == run["run_id"].replace("-rep2", "")
        peaks = played[source]["ranks"][0]["peak_bytes"]
        assert memory["dryrun_peak_bytes"] == max(peaks[p] for p in ("first_step", "step", "aggregation") if p in peaks)
        shard = played[run["run_id"]]["traffic"]["step"]["shard"]
        assert shard["model"] > 0 and shard["dryrun"] == pytest.approx(shard["model"], rel=0.02)
    assert "dry-run" in out.splitlines()[[i for i, line in enumerate(out.splitlines()) if "memory/device" in line][0]]


def test_diloco_state_built_with_the_trainer_is_counted(tmp_path):
    """DiLoCo's synchronized copy and momentum (fp32, each rank's shard) exist before the tracker starts; the
    dry-run holds them from the build on: 8 B more per local parameter than FedAvg's."""
    peaks = {}
    for outer in ("fedavg", "diloco"):
        raw = _spec({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 4, "train": {"outer": outer}}, tmp_path)
        peaks[outer] = dryrun(RunSpec.from_dict(raw))["peak_bytes"]
    local = peaks["fedavg"]["build"] / 4  # fp32 parameters, sharded (FSDP pads them: the copies are a bit less)
    for phase in ("build", "step"):
        assert peaks["diloco"][phase] - peaks["fedavg"][phase] == pytest.approx(8 * local, rel=1e-3), phase
