"""Checkpoints store the parameters once, not once per federation group, and the plan's size formula is
what DCP really writes (4 gloo ranks, the tiny Llama). Sizes are read from DCP's metadata: the files add
per-tensor headers, RNG states and meta.json, a few hundred KB here, nothing next to 8B parameters."""
import math
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from launcher.placement.costmodel import checkpoint_bytes
from tests.support import run_ranks

STEP_COUNTERS = 4 * 64  # AdamW's per-tensor step count (fp32 scalars), per group: fewer than 64 tensors here
LAYOUTS = [("fsdp", 1, 1, 4, None, "fp32"), ("fl_fsdp", 4, 1, 1, 2, "fp32"), ("fl_hsdp", 2, 2, 1, 2, "paper")]


def _save_around_fedavg(rank, world, root):
    from train import model as models
    from train.contract.spec import RunSpec
    from train.loop import Trainer

    params = {}
    for strategy, F, R, S, A, precision in LAYOUTS:
        out_dir = Path(root) / strategy
        spec = RunSpec.from_dict({"strategy": strategy, "F": F, "R": R, "S": S, "A": A, "out_dir": str(out_dir),
                                  "train": {"steps": 8, "seq_len": 16, "precision": precision}})
        trainer = Trainer(spec, rank, "cpu")
        trainer.restore()
        for i in range(3):
            trainer.step(i)
            if i + 1 >= 2:  # step 2 ends with a FedAvg in the FL layouts, step 3 does not
                trainer.checkpointer.save(trainer.model, trainer.optimizer, trainer.state)
        params[strategy] = models.count_params(trainer.model)
    return params


def _tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of the tensors DCP stored, by top-level key (model, optim, fed0, ...): from its metadata."""
    out: dict[str, int] = {}
    for fqn, meta in dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            key = fqn.split(".")[0]
            out[key] = out.get(key, 0) + math.prod(meta.size) * meta.properties.dtype.itemsize
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return root, run_ranks(_save_around_fedavg, 4, str(root))[0]


@pytest.mark.parametrize("strategy,F,R,S,A,precision", LAYOUTS)
def test_parameters_are_stored_once_after_a_fedavg(saved, strategy, F, R, S, A, precision):
    root, params = saved
    after = root / strategy / "checkpoints" / "step-000002"
    stored = _tensor_bytes(after)
    b = 2 if precision == "paper" else 4
    assert stored["model"] == params[strategy] * b  # one copy of the parameters, whatever F
    # The AdamW moments differ per group: 2 per parameter in every group (plus each group's step counters).
    moments = sum(v for k, v in stored.items() if k != "model")
    assert 0 <= moments - 2 * F * params[strategy] * b <= F * STEP_COUNTERS
    assert 0 <= sum(stored.values()) - checkpoint_bytes(params[strategy], F, precision) <= F * STEP_COUNTERS


@pytest.mark.parametrize("strategy,F,R,S,A,precision", LAYOUTS[1:])
def test_a_checkpoint_between_averagings_stores_every_group(saved, strategy, F, R, S, A, precision):
    root, params = saved
    between = root / strategy / "checkpoints" / "step-000003"
    stored = _tensor_bytes(between)
    assert "model" not in stored and sorted(stored) == [f"fed{f}" for f in range(F)]
    expected = checkpoint_bytes(params[strategy], F, precision, at_fedavg=False)
    assert 0 <= sum(stored.values()) - expected <= F * STEP_COUNTERS
