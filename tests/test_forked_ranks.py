"""A local run's ranks forked by its job's one task (train.job.forked_ranks), through the Local scheduler's
executor: each rank is what a submitit task was (its rank, its logs, its status), a failing rank ends the others, and
the ranks die with their task."""
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import submitit

from launcher.scheduler import RanksExecutor
from tests.support import children, clean_env, wait_for
from train.contract.common import DataError


class Report:
    """Each rank says who it is and where it came from; rank 0's value is the job's."""

    PRELOAD = ("json",)

    def __call__(self):
        rank = int(os.environ["SUBMITIT_LOCAL_GLOBALID"])
        print(f"out of rank {rank}")
        print(f"err of rank {rank}", file=sys.stderr)
        return {"rank": rank, "world": int(os.environ["SUBMITIT_LOCAL_NTASKS"]), "parent": os.getppid(),
                "preloaded": "json" in sys.modules, "env": submitit.JobEnvironment().global_rank}


class FailOn:
    """Rank `rank` fails with a DataError after the others have started waiting for it forever."""

    PRELOAD = ()

    def __init__(self, rank: int, folder: str):
        self.rank, self.folder = rank, folder

    def __call__(self):
        rank = int(os.environ["SUBMITIT_LOCAL_GLOBALID"])
        Path(self.folder, f"pid{rank}").write_text(str(os.getpid()))
        if rank != self.rank:
            time.sleep(600)
        raise DataError("the shard is missing")


class Staggered:
    """Rank r ends 0.4 s after rank r + 1: rank 0, whose value is the job's, ends last."""

    PRELOAD = ()

    def __init__(self, folder: str, ranks: int):
        self.folder, self.ranks = folder, ranks

    def __call__(self):
        rank = int(os.environ["SUBMITIT_LOCAL_GLOBALID"])
        time.sleep(0.4 * (self.ranks - 1 - rank))
        Path(self.folder, f"done{rank}").touch()
        return rank


class Sleep:
    PRELOAD = ()

    def __init__(self, folder: str):
        self.folder = folder

    def __call__(self):
        Path(self.folder, f"pid{os.environ['SUBMITIT_LOCAL_GLOBALID']}").write_text(str(os.getpid()))
        time.sleep(600)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for key in list(os.environ):
        if key.startswith("SUBMITIT_"):
            monkeypatch.delenv(key)
    for key, value in clean_env().items():
        monkeypatch.setenv(key, value)


def _submit(tmp_path: Path, job, ranks: int):
    executor = RanksExecutor(folder=tmp_path / "submitit", ranks=ranks)
    executor.update_parameters(tasks_per_node=1, nodes=1, timeout_min=5)
    return executor.submit(job)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


def test_each_rank_is_a_task_with_its_own_rank_and_logs(tmp_path):
    job = _submit(tmp_path, Report(), 3)
    value = job.result()
    task = int(job.job_id)  # the controller; its one child is the task that forked the ranks
    assert value["rank"] == 0 and value["world"] == 3 and value["env"] == 0 and value["preloaded"]
    assert value["parent"] != task  # forked by the task, not started by the controller
    folder = tmp_path / "submitit"
    for rank in range(3):
        out = (folder / f"{job.job_id}_{rank}_log.out").read_text()
        err = (folder / f"{job.job_id}_{rank}_log.err").read_text()
        assert f"out of rank {rank}" in out and f"err of rank {rank}" in err
        assert all(f"of rank {other}" not in out + err for other in range(3) if other != rank)
    assert not list(folder.glob("*_rank_value.pkl"))  # the ranks' values are read and removed


def test_a_failing_rank_ends_the_others_and_names_itself(tmp_path):
    started = time.monotonic()
    job = _submit(tmp_path, FailOn(1, str(tmp_path)), 3)
    with pytest.raises(submitit.core.utils.FailedJobError) as failed:
        job.result()
    assert time.monotonic() - started < 60  # not the others' 600 s sleep
    line = [line for line in str(failed.value).splitlines() if "RankError" in line][-1]
    assert "rank 1 of 3 exited with status 1: " in line and "DataError: the shard is missing" in line
    for rank in (0, 2):
        assert not _alive(int((tmp_path / f"pid{rank}").read_text()))


def test_the_task_waits_for_every_rank_before_it_ends(tmp_path):
    """The task ends only once all its ranks have: none is killed with it while finishing (they die with their
    task), and rank 0's value is there even when it ends last."""
    job = _submit(tmp_path, Staggered(str(tmp_path), 4), 4)
    assert job.result() == 0
    assert sorted(p.name for p in tmp_path.glob("done*")) == ["done0", "done1", "done2", "done3"]


def test_the_ranks_die_with_their_task(tmp_path):
    job = _submit(tmp_path, Sleep(str(tmp_path)), 2)
    wait_for(lambda: all((tmp_path / f"pid{r}").exists() for r in range(2)), "both ranks", timeout_s=60)
    ranks = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    (task,) = children(int(job.job_id))
    assert sorted(children(task)) == sorted(ranks)
    os.kill(task, signal.SIGKILL)
    wait_for(lambda: not any(_alive(pid) for pid in ranks), "the ranks to end", timeout_s=10)
    job.cancel()


def test_the_controllers_signals_reach_every_rank(tmp_path):
    """A cancel (the controller's SIGINT to its task) reaches the ranks. (A launcher that ignores SIGINT starts its
    controllers with it at its default: tests/test_control.py's cancel.)"""
    job = _submit(tmp_path, Sleep(str(tmp_path)), 2)
    wait_for(lambda: all((tmp_path / f"pid{r}").exists() for r in range(2)), "both ranks", timeout_s=60)
    (task,) = children(int(job.job_id))
    os.kill(task, signal.SIGINT)
    wait_for(lambda: job.done(), "the job to end", timeout_s=30)
    errors = [(tmp_path / "submitit" / f"{job.job_id}_{r}_log.err").read_text() for r in range(2)]
    assert all("KeyboardInterrupt" in text for text in errors), json.dumps(errors)[-2000:]
