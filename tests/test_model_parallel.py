"""Tensor and pipeline parallelism (train.tp, train.pp) under each strategy, on real gloo processes.

Every step's loss, and every parameter after the last step, against the single-process reference of the same
global batches (tests/reference.py), which the tp = pp = 1 runs of each strategy match to 1e-5
(tests/test_parity.py): so a run with tp = 2, pp = 2 or both matches its tp = pp = 1 counterpart.
"""
import functools
import json

import pytest

from tests import forked
from tests.reference import Reference
from tests.support import clean_env, losses, run_ranks, uninterrupted
from train.contract.result import RunResult
from train.contract.spec import RunSpec
from train.loop import Trainer

STEPS = 6
TOL = 1e-5


def _worker(rank, world, specs):
    """Each spec in turn on the same ranks (one spawn per world size: starting processes costs more than
    training the tiny model)."""
    return [_case(rank, spec_dict) for spec_dict in specs]


def _case(rank, spec_dict):
    spec = RunSpec.from_dict(spec_dict)
    trainer = Trainer(spec, rank, "cpu")
    trainer.restore()
    ref = Reference(spec)
    f, _, _, p, t = trainer.coord
    losses, ref_losses = [], []
    for i in range(STEPS):
        losses.append(trainer.step(i).item())
        ref_losses.append(ref.step(i)[f])
    mine = dict(ref.models[f].named_parameters())
    worst = max((param.full_tensor() - mine[name]).abs().max().item()
                for name, param in trainer.model.named_parameters())
    last = p == spec.layout.P - 1
    split = sorted(n for n, q in trainer.model.named_parameters() if "tp" in q.device_mesh.mesh_dim_names
                   and q.placements[q.device_mesh.mesh_dim_names.index("tp")].is_shard())
    return {"coord": trainer.coord, "data_rank": trainer.data_rank, "loss": losses if last else None,
            "ref": ref_losses, "param_diff": worst, "names": sorted(n for n, _ in trainer.model.named_parameters()),
            "tp_split": split}


def _spec(strategy, F, R, S, A=None, **train):
    return {"strategy": strategy, "F": F, "R": R, "S": S, "A": A, "out_dir": "/nonexistent",
            "model": {"preset": "tiny"},
            "train": {"steps": STEPS, "seq_len": 16, "batch_per_rank": 2, "lr": 1e-3, "eps": 1e-6, "warmup_frac": 0.1,
                      **train}}


LAYOUTS = {"fsdp": ("fsdp", 1, 1, 2), "hsdp": ("hsdp", 1, 2, 1), "fl_fsdp": ("fl_fsdp", 2, 1, 1, 2),
           "fl_hsdp": ("fl_hsdp", 2, 2, 1, 2)}
SPLIT = tuple(f"{m}.weight" for m in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                       "lm_head"))
AXES = {"tp2": {"tp": 2}, "pp2": {"pp": 2}, "tp2_pp2": {"tp": 2, "pp": 2}}
# sequence parallelism (train.sequence_parallel) under each strategy with tp = 2, and once with pipeline stages
SEQUENCE = {"tp2_sp": {"tp": 2, "sequence_parallel": True}, "tp2_pp2_sp": {"tp": 2, "pp": 2, "sequence_parallel": True}}


# DiLoCo with an int8 exchange over tensor- and pipeline-split shards, against the exact-mean reference
# (tests/test_parity.py's bound for int8: 5e-3 on parameters; the losses follow them).
# Streamed DiLoCo: 2 fragments cut from the whole model (so a stage syncs the same parameters as the reference),
# one fragment every step at A = 2; and pp = 2 with each exchange overlapping a step (A = 4). With tp = 2 the
# parameters drift from the reference by up to 3.7e-5 (embed_tokens; 3.6e-5 with tp = 2 alone, 5.0e-6 with
# pp = 2 alone, 5.7e-6 for unstreamed DiLoCo at tp = 2; measured 2026-12-02): tp's other reduction order moves
# gradients by ~1e-7, which AdamW's first steps and outer Nesterov steps from step 1 on (lr 0.7, mu 0.9)
# amplify; the losses stay within 1e-7 of the reference.
EXTRA = {("fl_fsdp_diloco_int8", "tp2_pp2"): ({"outer": "diloco", "aggregation_dtype": "int8"}, 5e-3),
         ("fl_fsdp_diloco_fragments", "tp2_pp2"): ({"outer": "diloco", "outer_fragments": 2}, 1e-4),
         ("fl_fsdp_diloco_delay", "pp2"): ({"outer": "diloco", "outer_fragments": 2, "outer_delay": 1, "A": 4}, TOL)}


CASES = [(lay, ax) for lay in LAYOUTS for ax in AXES] + [(lay, "tp2_sp") for lay in LAYOUTS] + \
    [("fl_fsdp", "tp2_pp2_sp")] + list(EXTRA)


def _case_spec(layout: str, axes: str) -> dict:
    train = dict(EXTRA.get((layout, axes), ({}, TOL))[0])
    strategy, F, R, S, *A = LAYOUTS[layout.split("_diloco")[0]]
    return _spec(strategy, F, R, S, train.pop("A", A[0] if A else None), **(AXES | SEQUENCE)[axes], **train)


@functools.cache
def _outcomes(world: int) -> dict:
    """Every case of this world size, run in one spawn: case -> each rank's outcome."""
    cases = [c for c in CASES if RunSpec.from_dict(_case_spec(*c)).world_size == world]
    by_rank = run_ranks(_worker, world, [_case_spec(*c) for c in cases])
    return {case: [outs[i] for outs in by_rank] for i, case in enumerate(cases)}


@pytest.mark.parametrize("layout,axes", CASES)
@pytest.mark.slow
def test_model_parallel_matches_reference(layout, axes):
    spec, tol = _case_spec(layout, axes), EXTRA.get((layout, axes), ({}, TOL))[1]
    outs = _outcomes(RunSpec.from_dict(spec).world_size)[(layout, axes)]
    group = spec["R"] * spec["S"]
    for f in range(spec["F"]):
        mine = [o["loss"] for o in outs if o["loss"] is not None and o["coord"][0] == f]
        measured = [sum(step) / len(step) for step in zip(*mine)]  # the group's mean over its data ranks (x tp)
        assert len(mine) == group * spec["train"].get("tp", 1)
        expected = outs[0]["ref"] if f == 0 else next(o["ref"] for o in outs if o["coord"][0] == f)
        rel = max(abs(a - b) / abs(b) for a, b in zip(measured, expected))
        print(f"{layout} {axes} group {f}: loss rel diff {rel:.2e}")
        assert rel <= tol, f"{layout} {axes}: group {f}'s loss differs from the reference by {rel:.2e} (relative)"
    worst = max(o["param_diff"] for o in outs)
    assert worst <= tol, f"{layout} {axes}: max |param - reference| = {worst:.3e} after {STEPS} steps"
    # tp = 2: every matrix of the blocks and lm_head is split over the tensor-parallel group, nothing else
    for o in outs:
        expected = [n for n in o["names"] if spec["train"].get("tp", 1) > 1 and n.endswith(SPLIT)]
        assert o["tp_split"] == expected and (expected or spec["train"].get("tp", 1) == 1)
    if spec["train"].get("pp", 1) > 1:  # the stages hold the model between them, under its own names
        stages = {tuple(o["names"]) for o in outs}
        assert len(stages) == 2 and not set(min(stages)) & set(max(stages))


def _torchrun(spec: dict, tmp_path, name: str, entry=("train",)) -> forked.Ranks:
    """`torchrun -m ENTRY... SPEC` on one forked rank per process of the layout (tests/forked.py)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**spec, "out_dir": str(tmp_path / name)}))
    return forked.torchrun(*entry, str(path), nproc=RunSpec.from_dict(spec).world_size, env=clean_env())


@pytest.mark.slow
def test_stopped_with_tp_and_pp_then_rerun_resumes_exactly(tmp_path):
    """FL+FSDP with tp = 2 (sequence-parallel) and pp = 2 (8 ranks) through `python -m train`: stopped by the
    scheduler's signal after step 10, between two FedAvgs (every group's model and optimizer saved apart), it
    resumes to the losses of an uninterrupted run, bit for bit; result.json records the layout. (Without sequence
    parallelism, tests/test_elastic.py resumes tp = 2 x pp = 2 on another layout.)"""
    spec = _spec("fl_fsdp", 2, 1, 1, A=4, tp=2, pp=2, microbatches=2, pp_schedule="gpipe", steps=16, log_every=2,
                 stop_check_every=1, eval_every=8, sequence_parallel=True)  # step 10 logs: the stop is agreed there
    uninterrupted({**spec, "out_dir": str(tmp_path / "reference")})
    stopped = _torchrun(spec, tmp_path, "stopped", entry=["tests.stop_at_step", "10"])
    assert stopped.wait(timeout=600) != 0 and "after step 10" in stopped.stderr
    resumed = _torchrun(spec, tmp_path, "stopped")
    assert resumed.wait(timeout=600) == 0, resumed.stderr[-2000:]
    result = RunResult.load(tmp_path / "stopped" / "result.json")
    assert result.resumed_from_step == 10 and (result.tp, result.pp, result.microbatches) == (2, 2, 2)
    assert result.run_id == "fl_fsdp-F2-R1-S1-A4-P2-T2" and result.world_size == 8
    assert losses(tmp_path / "stopped") == losses(tmp_path / "reference")
    ref = RunResult.load(tmp_path / "reference" / "result.json")
    assert [e[2] for e in result.eval_history] == [e[2] for e in ref.eval_history]
    assert result.tokens == ref.tokens == 16 * 2 * 2 * 16  # steps x data ranks x batch x seq_len
