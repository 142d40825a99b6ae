"""DiLoCo (train.outer=diloco): its outer state survives a crash bitwise, it applies to federated runs only,
streamed fragments and checkpoints. Parity with the single-process reference (every mode) and with FedAvg at
lr 1, momentum 0: tests/test_parity.py."""
import json

import pytest

from tests.support import losses, uninterrupted
from tests.test_checkpoint import _spec, _torchrun
from train.contract.config import TrainConfig
from train.contract.result import RunResult
from train.contract.spec import RunSpec
from train.federation.outer import split
from train.runtime.checkpoint import Checkpointer

# (A, train keys, the step whose checkpoint a rank dies writing). Whole syncs: checkpoints at the FedAvgs (A=3)
# at or after 10, 20: steps 12, 21. Streamed (3 fragments, one launched every 2 steps and landing 1 step later):
# at the first step with nothing in flight at or after 10, 20: steps 11, 21.
MODES = {"whole": (3, {"outer": "diloco", "outer_offload": True}, 21, 12),
         "streamed": (6, {"outer": "diloco", "outer_fragments": 3, "outer_delay": 1}, 21, 11)}


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m == "streamed" else m for m in MODES])
def test_rank_killed_while_checkpointing_diloco_resumes_with_its_outer_state_exactly(tmp_path, mode):
    A, keys, crash_at, resumed_from = MODES[mode]

    def spec(name, **more):
        path = _spec(tmp_path, name, A=A)
        raw = json.loads(path.read_text())
        raw["train"].update(steps=40, checkpoint_every=10, **keys, **more)
        path.write_text(json.dumps(raw))
        return path
    uninterrupted(json.loads(spec("reference").read_text()))
    first = _torchrun(spec("killed"), entry=["tests.crash_in_checkpoint", str(crash_at), "2"])
    assert first.wait(timeout=600) != 0
    second = _torchrun(spec("killed"))
    assert second.wait(timeout=600) == 0, second.stderr[-2000:]
    # The synchronized copy and momentum came back: a lost momentum or a stale copy changes every later loss.
    assert RunResult.load(tmp_path / "killed" / "result.json").resumed_from_step == resumed_from
    assert losses(tmp_path / "killed") == losses(tmp_path / "reference")
    if mode != "streamed":
        return
    # The stop signal after step 16 is agreed at step 20, the next that logs (log_every 5), while the fragment
    # launched after step 20 is in flight (a fragment every 2 steps, landing 1 later): the ranks go on to step 21
    # (quiet) and checkpoint there, so the resume is exact too (landing it early would not be).
    stopped = _torchrun(spec("stopped", stop_check_every=1), entry=["tests.stop_at_step", "16"])
    assert stopped.wait(timeout=600) != 0 and "stopped by SIGUSR2 after step 21" in stopped.stderr
    resumed = _torchrun(spec("stopped", stop_check_every=1))
    assert resumed.wait(timeout=600) == 0, resumed.stderr[-2000:]
    assert RunResult.load(tmp_path / "stopped" / "result.json").resumed_from_step == 21
    assert losses(tmp_path / "stopped") == losses(tmp_path / "reference")


def test_outer_settings_apply_to_federated_runs_only():
    fsdp = RunSpec.from_dict({"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "out_dir": "/x",
                              "train": {"outer": "diloco", "outer_lr": 0.3}})
    assert (fsdp.train.outer, fsdp.train.outer_lr) == ("fedavg", TrainConfig.outer_lr)  # same identity as FedAvg's
    fl = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 4, "out_dir": "/x",
                            "train": {"outer": "diloco", "outer_lr": 0.3}})
    assert (fl.train.outer, fl.train.outer_lr) == ("diloco", 0.3)


def test_fragments_are_runs_of_about_equal_size_each_holding_a_tensor():
    assert split([10] * 6, 3) == [[0, 1], [2, 3], [4, 5]]
    assert split([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert split([1, 1, 100], 3) == [[0], [1], [2]]
    assert split([5, 5], 1) == [[0, 1]]


def test_streamed_checkpoints_wait_for_the_exchange_in_flight_to_land(tmp_path):
    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 6, "out_dir": str(tmp_path),
                              "train": {"steps": 30, "checkpoint_every": 5, "outer": "diloco",
                                        "outer_fragments": 3, "outer_delay": 1}})
    ckpt = Checkpointer(spec, 0)
    # a fragment launches after every even step and lands after the next one: odd steps are quiet
    assert [s for s in range(1, 31) if ckpt.due(s, 30)] == [5, 11, 15, 21, 25, 30]
    assert ckpt.per_group(6) == ["model", "optim"]  # the groups never hold the same model
