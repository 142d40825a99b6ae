"""train.reduce_dtype is what FSDP reduces gradients in on every backend (issue 38, item 4): on real gloo ranks
under precision=paper (bf16 parameters), the shard group's reduce-scatters carry 4 bytes per gradient value with
fp32 and 2 with bf16, counted by train.job.dryrun's dispatch mode, and result.json records the choice."""
import torch

from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.job.dryrun import Watch, group_names


def _train_rank(rank: int, world: int, raw: dict) -> dict:
    from train.loop import Trainer

    trainer = Trainer(RunSpec.from_dict(raw), rank, "cpu")
    watch = Watch(group_names(trainer.mesh), fake=False)
    watch.strict = False
    with watch:
        result = trainer.run("gloo")
    scattered = sum(c["bytes"] for phase in watch.report()["collectives"].values() for c in phase
                    if "reduce_scatter" in c["op"] and "shard" in c["group"])
    return {"reduce_dtype": result and result.reduce_dtype, "scattered": scattered,
            "param_dtypes": {str(p.dtype) for p in trainer.model.parameters()}}


def _run(tmp_path, reduce_dtype: str) -> dict:
    raw = {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "A": 1, "model": {"preset": "tiny"}, "run_id": reduce_dtype,
           "out_dir": str(tmp_path / reduce_dtype),
           "train": {"steps": 2, "log_every": 2, "precision": "paper", "reduce_dtype": reduce_dtype}}
    return run_ranks(_train_rank, 2, raw)[0]


def test_gradients_are_reduced_in_the_dtype_the_spec_names(tmp_path):
    fp32, bf16 = _run(tmp_path, "fp32"), _run(tmp_path, "bf16")
    assert fp32["scattered"] > 0
    assert fp32["scattered"] == 2 * bf16["scattered"]  # the same gradients, 4 bytes a value against 2
    for got in (fp32, bf16):
        assert got["param_dtypes"] == {str(torch.bfloat16)}
    assert (fp32["reduce_dtype"], bf16["reduce_dtype"]) == ("fp32", "bf16")  # what result.json holds
