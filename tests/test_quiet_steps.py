"""A step that neither logs, averages, evaluates nor checkpoints waits for nothing (issue 38): on real gloo ranks
running Trainer.train, counted per step by train.job.dryrun's dispatch mode, it reads no device value on the host
and issues no barrier and no collective spanning federation groups; the phases are still timed. Every process
group has the run's timeout, not torch's per-group default."""
import torch
import torch.distributed as dist

from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.job.dryrun import Watch, group_names
from train.runtime import launch_env

STEPS, TALKS = 8, {4, 8}  # log_every = A = 4: steps 4 and 8 log and average; the stop signal is agreed there


def _train_rank(rank: int, world: int, raw: dict) -> dict:
    from train.loop import Trainer

    spec = RunSpec.from_dict(raw)
    trainer = Trainer(spec, rank, "cpu")
    launch_env.apply_timeout(spec.train.timeout_s)
    c10d = dist.distributed_c10d
    timeouts = {c10d._get_process_group_name(g): g._get_backend(torch.device("cpu")).options._timeout.total_seconds()
                for g in c10d._world.pg_map if not c10d._rank_not_in_group(g)}
    watch = Watch(group_names(trainer.mesh), fake=False)
    watch.strict = False  # count host reads, do not refuse them
    step = trainer.step

    def marked(i: int):  # everything until the next step belongs to this one: its loop tail too
        watch.phase = str(i + 1)
        return step(i)

    trainer.step = marked
    with watch:
        trainer.train()
    return {**watch.report(), "rows": trainer.log.rows, "timeouts": timeouts}


def test_quiet_steps_read_nothing_and_wait_for_no_other_group(tmp_path):
    raw = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 4, "model": {"preset": "tiny"},
           "out_dir": str(tmp_path), "train": {"steps": STEPS, "log_every": 4, "stop_check_every": 1}}
    reports = run_ranks(_train_rank, RunSpec.from_dict(raw).world_size, raw)
    for rank, got in enumerate(reports):
        for done in range(1, STEPS + 1):
            ops = {(c["op"], c["group"]) for c in got["collectives"].get(str(done), [])}
            crossing = {(op, group) for op, group in ops if "fed" in group or op == "barrier"}
            if done in TALKS:
                assert crossing, (rank, done)  # the check is live: these steps do talk across the world
                continue
            assert got["host_syncs"].get(str(done), 0) == 0, (rank, done, got["host_syncs"])
            assert not crossing, (rank, done, crossing)
            assert ("allreduce_", "replicate") in ops  # HSDP's gradient all-reduce within the group
    assert len(reports[0]["timeouts"]) > 4  # the world, the mesh's dimensions and more: each has the run's timeout
    assert all(set(r["timeouts"].values()) == {RunSpec.from_dict(raw).train.timeout_s} for r in reports)
    rows = reports[0]["rows"]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["forward"] > 0 and r["backward"] > 0 and r["step_time"] >= r["forward"] for r in rows)
    assert [r["step"] for r in rows if r["aggregated"]] == sorted(TALKS)  # the steps that talk are the FedAvgs


def test_an_averaging_step_reads_nothing_and_issues_only_its_exchange(tmp_path):
    """Steps 2 and 6 average but do not log (A = 2, log_every = 4): the exchange over the fed group and the
    replicas' gather are their only collectives beyond the step's own, and nothing is read on the host (the
    non-finite guard's notes ride on the exchange: a non-finite chunk is not written back; the stop signal is
    agreed where the world talks anyway). The run's first average also checks, once, that the groups' shards align
    (train.federation.alignment), which reads on the host: step 6 is the average measured."""
    raw = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 2, "model": {"preset": "tiny"},
           "out_dir": str(tmp_path), "train": {"steps": STEPS, "log_every": 4, "stop_check_every": 1}}
    reports = run_ranks(_train_rank, RunSpec.from_dict(raw).world_size, raw)
    for rank, got in enumerate(reports):
        ops = {done: {(c["op"], c["group"]) for c in got["collectives"].get(str(done), [])} for done in (2, 6)}
        assert ("allreduce_", "fed") in ops[2] and ("allreduce_", "fed") in ops[6], (rank, ops)  # the exchange
        assert got["host_syncs"].get("6", 0) == 0, (rank, got["host_syncs"])
        assert {group for _, group in ops[6]} <= {"fed", "replicate", "shard"}, (rank, ops[6])
        assert ("_allgather_base_", "replicate") in ops[6]  # the replicas put their shares together
    assert [r["step"] for r in reports[0]["rows"] if r["aggregated"]] == [2, 4, 6, 8]
