"""Which lost federation group the launcher starts again on SLURM (launcher.actions.groups): only one that may find
a peer holding the run's state when it joins (the whole path runs on the testbed in tests/test_testbed.py)."""
from types import SimpleNamespace

import pytest

from launcher.actions.groups import GroupJobs


def _jobs(*job_ids: str, ended=()) -> GroupJobs:
    """The launcher's view of a run's group jobs, as its polls leave it (no job is submitted here)."""
    jobs = object.__new__(GroupJobs)
    jobs.F, jobs.ended = len(job_ids), set(ended)
    jobs.jobs = [SimpleNamespace(job_id=i) for i in job_ids]
    return jobs


@pytest.mark.parametrize("polled, ended, restart", [
    ({"1": "NODE_FAIL", "2": "RUNNING", "3": "RUNNING"}, (), True),  # the others train on
    ({"1": "NODE_FAIL", "2": "COMPLETING", "3": "PENDING"}, (), True),
    ({"1": "NODE_FAIL", "2": None, "3": "PENDING"}, (), True),  # a state SLURM did not give may be a live group
    ({"1": "NODE_FAIL", "2": "PENDING", "3": "PENDING"}, (), False),  # restarted groups waiting for nodes
    ({"1": "NODE_FAIL", "3": "PENDING"}, (), False),  # group 1's job was submitted again in this very poll
    ({"1": "NODE_FAIL", "2": "FAILED", "3": "FAILED"}, (), False),  # lost in the same poll
    ({"1": "NODE_FAIL", "2": "COMPLETED", "3": "COMPLETED"}, (1, 2), False),  # the others ended: no peer left
])
def test_a_lost_group_is_started_again_only_while_another_may_hold_the_runs_state(polled, ended, restart):
    assert _jobs("1", "2", "3", ended=ended)._others_train(0, polled) is restart
