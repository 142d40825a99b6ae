"""Where a fault-tolerant run's groups meet before their first quorum (train/federation/lighthouse.py): each says
it is ready in the run directory and waits for the others; a new attempt forgets an earlier one's marks."""
import threading

import pytest

from train.contract.common import FedshardError
from train.contract.spec import RunSpec
from train.federation.lighthouse import READY, clear_ready, wait_for_groups


def test_a_group_waits_for_every_group_and_names_the_ones_that_never_came(tmp_path):
    with pytest.raises(FedshardError, match=r"federation group 0: group\(s\) \[1, 2\] did not start within "
                                            r"train.timeout_s=0.2 s"):
        wait_for_groups(tmp_path, 0, 3, 0.2)
    late = threading.Timer(0.3, lambda: [(tmp_path / READY.format(g)).touch() for g in (1, 2)])
    late.start()
    wait_for_groups(tmp_path, 0, 3, 10.0)  # returns once the two others have said so
    late.join()


def test_a_new_attempt_forgets_which_groups_were_ready(tmp_path):
    spec = RunSpec.from_dict({"strategy": "fl_fsdp", "F": 3, "R": 1, "S": 1, "A": 2, "out_dir": str(tmp_path),
                              "train": {"fault_tolerance": "groups"}})
    for g in range(3):
        (tmp_path / READY.format(g)).touch()
    clear_ready(spec)
    assert not list(tmp_path.glob(".ready-group*"))
