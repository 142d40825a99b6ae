"""The alignment guard catches every injected misalignment and never fires on valid layouts (4 gloo ranks)."""
import pytest
import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

from tests.support import grid, run_ranks
from train import model as models
from train.contract.common import AlignmentError
from train.contract.spec import RunSpec
from train.federation import alignment
from train.loop import Trainer
from train.parallel import mesh as meshes

CONFIG = models.llama_config({"preset": "tiny", "vocab_size": 511})


def _sharded(dp_mesh, placement_fn=None):
    torch.manual_seed(0)
    model = models.build(CONFIG, "cpu")
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, shard_placement_fn=placement_fn)
    fully_shard(model, mesh=dp_mesh, shard_placement_fn=placement_fn)
    return model


def _reorder(model):
    """Same parameters, different order: re-registering self_attn moves it after the MLP and norms."""
    layer = model.model.layers[0]
    attn = layer.self_attn
    del layer.self_attn
    layer.self_attn = attn
    return model


def _injected(rank, world, injection):
    mesh = meshes.build("cpu", grid(2, 1, 2))  # F=2 groups of S=2 shards
    odd_group = grid(2, 1, 2).coords(rank)[0] == 1
    if injection == "different_S":
        # Group 1 shards over S=1 (HSDP R=2 x S=1) while group 0 uses S=2.
        other = meshes.build("cpu", grid(2, 2, 1))
        model = _sharded(other["replicate", "shard"] if odd_group else mesh["shard"])
    elif injection == "shard_dim1":
        fn = (lambda p: Shard(1) if p.ndim == 2 else Shard(0)) if odd_group else None
        model = _sharded(mesh["shard"], fn)
    elif injection == "param_order":
        model = _sharded(mesh["shard"])
        if odd_group:
            _reorder(model)
    elif injection == "weights":
        model = _sharded(mesh["shard"])
        if odd_group:
            with torch.no_grad():
                model.lm_head.weight.to_local().add_(1e-6)
    else:  # valid: uneven shards (511 rows over 2) with equal S
        model = _sharded(mesh["shard"])
    try:
        alignment.check(list(model.named_parameters()), mesh.get_group("fed"), "cpu",
                        contents=injection in ("weights", "valid"))
    except AlignmentError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("injection,expected", [
    ("different_S", "model.embed_tokens.weight"),
    ("shard_dim1", "S(1)"),
    ("param_order", "#1 across"),
    ("weights", "lm_head.weight"),
])
def test_guard_names_first_misaligned_parameter_and_ranks(injection, expected):
    messages = run_ranks(_injected, 4, injection)
    assert all(messages), f"{injection}: some ranks were not stopped: {messages}"
    for rank, msg in enumerate(messages):
        assert expected in msg, msg
        assert f"federation ranks [{rank % 2}, {rank % 2 + 2}]" in msg, msg


def test_guard_accepts_valid_uneven_layout():
    assert run_ranks(_injected, 4, "valid") == [None] * 4


def _meta_init(rank, world):
    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 2, "out_dir": "/nonexistent",
                              "train": {"init": "meta", "seq_len": 16}})
    trainer = Trainer(spec, rank, "cpu")
    trainer.restore()  # runs the guard with initial-content hashes: groups must agree
    fresh = models.build(trainer.config, "cpu")
    rotary = trainer.model.model.rotary_emb
    q = trainer.model.model.layers[0].self_attn.q_proj.weight.full_tensor()
    half = q.shape[0] // 2
    return {"rope": torch.equal(rotary.inv_freq, fresh.model.rotary_emb.inv_freq),
            "shards_differ": not torch.equal(q[:half], q[half:]),
            "std": q.std().item()}


def test_meta_init_gives_identical_groups_distinct_shards_and_true_rope():
    for out in run_ranks(_meta_init, 4):
        assert out["rope"] and out["shards_differ"]
        assert abs(out["std"] - CONFIG.initializer_range) < 0.2 * CONFIG.initializer_range
