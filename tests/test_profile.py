"""train.profile=START:STOP (issue 39, item 9): torch.profiler over those steps on every rank of a real gloo run,
one Chrome/Perfetto trace per rank under the run directory, named in result.json; a bad window is one line."""
import json

import pytest

from tests.support import uninterrupted
from train.contract.common import SpecError
from train.contract.spec import RunSpec


def test_profiled_steps_leave_one_trace_per_rank_named_in_the_result(tmp_path):
    spec = {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "A": 1, "model": {"preset": "tiny"}, "run_id": "profiled",
            "out_dir": str(tmp_path), "train": {"steps": 4, "log_every": 4, "profile": "1:3"}}
    result = uninterrupted(spec)
    assert result.profile == {"steps": [1, 2], "traces": ["profile/rank0.json", "profile/rank1.json"]}
    for name in result.profile["traces"]:
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert any("ProfilerStep" in n or n.startswith("aten::") for n in names)  # real recorded operators
        assert any("allgather" in n.lower() or "all_gather" in n.lower() for n in names), "FSDP's collectives"
    assert not list(tmp_path.rglob("*.json.tmp"))
    assert json.loads((tmp_path / "result.json").read_text())["profile"] == result.profile


@pytest.mark.parametrize("window", ["3:2", "0:5", "2", "a:b"])
def test_a_bad_profile_window_is_one_line(window):
    spec = {"strategy": "fsdp", "F": 1, "R": 1, "S": 1, "A": 1, "model": {"preset": "tiny"}, "run_id": "x",
            "out_dir": "/tmp/x", "train": {"steps": 4, "profile": window}}
    with pytest.raises(SpecError, match=r"train.profile must be START:STOP with 0 <= START < STOP <= train.steps"):
        RunSpec.from_dict(spec).validate()
