"""train.fault_tolerance=groups (issue 56): each federation group its own world, averaging through a torchft
quorum; on cluster=local one job's supervisor restarts a lost group, which heals from a live peer while the others
train on (train/federation: groups, lighthouse, accounting; train.job.forked_ranks)."""
import json
import os
import signal
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import ROOT, children, clean_env, losses, run_ranks, uninterrupted_like, wait_for
from train.contract.result import RunResult
from train.contract.spec import RunSpec
from train.federation import lighthouse
from train.runtime.launch_env import DistEnv, Seat

RUN = "fl_fsdp-F2-R1-S2-A2"
pytestmark = pytest.mark.slow


def _launch(tmp_path, *overrides, run=RUN):
    """The smoke sweep's FL+FSDP run, (2,1,2) A = 2 on `tiny` unless overridden, as fault-tolerant groups on
    cluster=local; returns the sweep's folder and the run's."""
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "sweep.strategies=[fl_fsdp]",
                           "train.fault_tolerance=groups", *overrides, f"results_dir={tmp_path / 'results'}"],
                          capture_output=True, text=True, cwd=ROOT, env=clean_env(slurm_client=False), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = tmp_path / "results" / "local" / "smoke"
    entry = json.loads((sweep / "manifest.jsonl").read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 1, entry  # no retry: the job itself went on
    return sweep, sweep / run


@pytest.mark.parametrize("extra", [[], ["train.outer=diloco", "train.outer_lr=0.7", "train.outer_momentum=0.9"],
                                   ["train.tp=2"], ["train.pp=2", "train.microbatches=2"],
                                   ["train.aggregation_dtype=int8"]],
                         ids=["fedavg", "diloco", "tp2", "pp2", "int8"])
def test_groups_as_separate_worlds_train_the_losses_of_one_world(tmp_path, extra):
    """Each group a world of its own, with tensor or pipeline parallelism inside it too (a group's mesh is the
    run's with fed of size 1, train.parallel.mesh.build_group), or int8 pseudo-gradients on the quorum's links (each
    group's weight 1/2 scales the int8 blocks exactly: the same values as one world's mean)."""
    sweep, _ = _launch(tmp_path, "sweep.train.steps=12", *extra)
    [run_dir] = [p.parent for p in sweep.glob("*/spec.json")]
    reference = uninterrupted_like(run_dir / "spec.json", tmp_path / "reference")  # the same spec in one world
    group0, group1, one = losses(run_dir / "group0"), losses(run_dir / "group1"), losses(tmp_path / "reference")
    assert [r[0::2] for r in group0] == [r[0::2] for r in group1] == [r[0::2] for r in one]  # steps, averages
    for a, b, whole in zip(group0, group1, one):  # each group's loss is the mean over its own ranks
        assert (a[1] + b[1]) / 2 == pytest.approx(whole[1], rel=1e-6)
    result = RunResult.load(run_dir / "result.json")
    assert result.eval_ppl == pytest.approx(reference.eval_ppl, rel=1e-6)
    assert result.world_size == 4 and [r.rank for r in result.ranks] == [0, 1, 2, 3]
    assert [(g["starts"], g["heals"], g["short_rounds"]) for g in result.groups] == [(1, [], [])] * 2
    assert all(g["merged_tokens"] == g["trained_tokens"] == result.tokens // 2 for g in result.groups)


@pytest.mark.parametrize("wire", ["fp32", "int8"])
def test_a_lost_group_heals_from_its_peer_while_the_other_trains_on(tmp_path, wire):
    """The same with int8 pseudo-gradients on the quorum's links (train.federation.groups' compressed exchange)."""
    sweep, run_dir = _launch(tmp_path, "sweep.train.steps=40", "train.fault_step=9", "train.fault_group=1",
                             f"train.aggregation_dtype={wire}")
    result = RunResult.load(run_dir / "result.json")
    group0, group1 = result.groups
    per_step = result.tokens // result.steps // 2  # one group's tokens per step
    assert group0["starts"] == 1 and group0["losses"] == [] and group0["merged_tokens"] == 40 * per_step
    assert group1["starts"] == 2 and "killed after step 9" in group1["losses"][0]["why"]
    loss = group1["losses"][0]
    # lost after step 9: its steps since the step-8 average never reach one; it heals at the peer's next average it
    # joins (step 10 when it is back within the 2 s the peer waits for the dead group, else a later one)
    healed = loss["healed_step"]
    assert loss["fault_step"] == 9 and healed % 2 == 0 and 10 <= healed < 40
    assert loss["tokens_lost"] == (healed - 8) * per_step and 0 < loss["fault_to_heal_s"] < 60
    assert group1["merged_tokens"] == (40 - (healed - 8)) * per_step and result.goodput > 0
    assert result.fault["healed_step"] == healed
    entry = json.loads((sweep / "manifest.jsonl").read_text())  # the manifest records each group's losses too
    assert [(g["group"], g["starts"], g["losses"]) for g in entry["groups"]] == [(0, 1, []), (1, 2, group1["losses"])]
    # the group that was never lost logged every step, none of them waiting past the grace window
    rows = [json.loads(line) for line in (run_dir / "group0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    spec = RunSpec.load(run_dir / "spec.json")
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    assert max(gaps) < spec.train.grace_s + statistics.median(gaps), gaps
    # the healed group went on from the step it healed at, with its peer's state: its own log holds its first life up
    # to the fault (as flushed) and every step after the heal
    steps1 = [r[0] for r in losses(run_dir / "group1")]
    assert steps1[-(40 - healed):] == list(range(healed + 1, 41))
    assert max((s for s in steps1 if s <= healed), default=0) <= 9
    assert result.eval_ppl < result.baseline_ppl
    table = (sweep / "table3.md").read_text()
    assert f"† {RUN}: federation group 1 killed after step 9" in table and f"healed from them at step {healed}" in table


def test_a_slow_group_does_not_stall_the_others_and_ends_healed_to_their_model(tmp_path):
    """(4,1,1): group 1 runs at a twentieth of its speed from step 9; the others average without it once the grace
    window has passed (torchft needs more than half of the groups it hears from: three of four), it heals when it
    comes, and every group ends holding the same model."""
    sweep, _ = _launch(tmp_path, "sweep.nodes=[4]", "cluster.gpus_per_node=1", "sweep.train.steps=40",
                       "train.fault_step=9", "train.fault_group=1", "train.fault_kind=slow", "train.fault_speed=0.05",
                       "train.grace_s=0.3", run="fl_fsdp-F4-R1-S1-A2")
    run_dir = sweep / "fl_fsdp-F4-R1-S1-A2"
    result = RunResult.load(run_dir / "result.json")
    slow, fast = result.groups[1], [result.groups[g] for g in (0, 2, 3)]
    # every fast group averaged without the slow one after the fault (a fast one may miss a round too, on 2 cores)
    assert all(g["short_rounds"] and all(r["step"] > 9 for r in g["short_rounds"]) for g in fast), fast
    assert slow["late_heals"] >= 1 and slow["heals"][-1]["step"] == 40 and slow["merged_tokens"] < result.tokens // 4
    ppl = {RunResult.load(run_dir / f"group{g}" / "result.json").eval_ppl for g in range(4)}
    assert ppl == {result.eval_ppl}, ppl  # one model, whichever group evaluates it
    # the rounds after the last step, which only wait for the slow group, send nothing and leave the bytes of the
    # last average that did: each group sends its fp32 shards twice (a ring all-reduce's volume at most)
    assert result.aggregation_bytes == 2 * 4 * result.params, (result.aggregation_bytes, result.params)


# ---- healing, bit for bit: two groups driven step by step in one test process

STEPS = 8
SPEC = {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 2, "out_dir": "/nonexistent", "model": {"preset": "tiny"},
        "train": {"steps": STEPS, "seq_len": 16, "lr": 1e-3, "fault_tolerance": "groups"}}


def _digest(trainer) -> list:
    """This rank's step, parameters and AdamW moments (summed per tensor): what healing must copy exactly."""
    import torch

    from train.parallel.parallelize import local
    params = list(trainer.model.parameters())
    moments = [float(local(v).sum()) for p in params for k, v in sorted(trainer.optimizer.state[p].items())
               if torch.is_tensor(v)]
    outer = trainer.fedavg.outer
    synced = [float(t.sum()) for t in [*outer.synced, *outer.velocity]] if outer is not None else []
    return [trainer.state.step, trainer.state.tokens, [float(local(p).detach().sum()) for p in params], moments,
            synced]


def _trainer(spec, rank, group, address, start):
    from train.loop import Trainer

    out_dir = Path(spec.out_dir) / f"group{group}"
    return Trainer(spec, rank, "cpu", out_dir=out_dir, launched=DistEnv(rank, 2, rank, "test", "test",
                                                                        seat=Seat(group, address, start)))


def _forget_manager(trainer, rank) -> None:
    """End a trainer's life in this process. A restarted group gets fresh processes and a fresh store; here the next
    life shares this one, where rank 0's torchft manager left its address: the next life's rank 1 must not read it
    before rank 0 has written its new one."""
    import torch.distributed as dist
    from torchft.manager import MANAGER_ADDR_KEY

    store = trainer.fedavg.manager._store
    trainer.fedavg.close()
    trainer.watchdog.close()
    dist.barrier()
    if rank == 0:
        store.delete_key(MANAGER_ADDR_KEY)
    dist.barrier()


def _group_rank(rank, world, group, address, restart_after, run_dir, over):
    """Train to STEPS; after `restart_after` steps group 1 drops its trainer and starts a fresh one (a group restarted
    from nothing), which heals as it joins. Returns (step, digest) after each average."""
    spec = RunSpec.from_dict({**SPEC, **over, "out_dir": run_dir, "train": {**SPEC["train"], **over.get("train", {})}})
    seen, trainer = [], _trainer(spec, rank, group, address, 0)
    trainer.restore()
    while trainer.state.step < STEPS:
        trainer.step(trainer.state.step)
        if trainer.state.step % 2 == 0:
            seen.append(_digest(trainer))
        if group == 1 and trainer.state.step == restart_after:
            _forget_manager(trainer, rank)
            trainer = _trainer(spec, rank, group, address, 1)
            trainer.restore()
            seen.append(["healed", *_digest(trainer)])
            restart_after = None
    trainer.fedavg.close()
    trainer.watchdog.close()
    return seen


def _run_groups(fn, F: int, grace_s: float, *args, running: int | None = None) -> list:
    """`fn`'s value on each rank of the first `running` (all F by default) of F groups of 2 ranks, each group its
    own world, meeting at one Lighthouse: [group][rank]."""
    server = lighthouse.Lighthouse(lighthouse.Federation(F, 1, grace_s))
    try:
        with ThreadPoolExecutor(running or F) as pool:
            return list(pool.map(lambda g: run_ranks(fn, 2, g, server.address, *args), range(running or F)))
    finally:
        server.stop()


@pytest.mark.parametrize("over", [{}, {"train": {"outer": "diloco", "outer_lr": 0.7, "outer_momentum": 0.9}},
                                  {"S": 1, "train": {"tp": 2}}, {"train": {"aggregation_dtype": "bf16"}}],
                         ids=["fedavg", "diloco", "tp2", "bf16"])
def test_a_restarted_group_heals_to_exactly_its_peers_state(tmp_path, over):
    """With DiLoCo (and with compressed FedAvg, DiLoCo at lr 1) the healed group also holds its peer's synchronized
    copy and outer momentum; with tp = 2 each rank its peer's tensor-parallel shards."""
    got = _run_groups(_group_rank, 2, 5.0, 4, str(tmp_path), over)
    for rank in range(2):
        peer = {d[0]: d for d in got[0][rank]}
        healed = next(d[1:] for d in got[1][rank] if d[0] == "healed")
        # joined at the peer's next average (step 6, or 8 if it came after the peer stopped waiting for it), and took
        # part in it with weight 0: step, tokens, parameters and moments are the peer's after that average
        assert healed[0] > 4 and healed == peer[healed[0]], (healed, peer.get(healed[0]))


def _resumed_rank(rank, world, group, address, run_dir):
    """Both groups train 4 steps and checkpoint; the attempt is then lost and starts again, but group 1 is lost once
    more before it said it was ready (its rendezvous failed, say) and restarts from nothing while group 0 resumes
    from the checkpoint. Returns this rank's digest once its group joined, and after the last step."""
    import torch.distributed as dist

    spec = RunSpec.from_dict({**SPEC, "out_dir": run_dir, "train": {**SPEC["train"], "timeout_s": 60}})
    trainer = _trainer(spec, rank, group, address, 0)
    trainer.restore()
    while trainer.state.step < 4:
        trainer.step(trainer.state.step)
    trainer.checkpointer.save(trainer.model, trainer.optimizer, trainer.state, trainer.fedavg)
    _forget_manager(trainer, rank)
    if rank == 0:  # the attempt's end: this group's ready mark goes (lighthouse.clear_ready), then both groups start
        (Path(run_dir) / lighthouse.READY.format(group)).unlink()
        (Path(run_dir) / f"ended{group}").touch()
        wait_for(lambda: all((Path(run_dir) / f"ended{g}").exists() for g in range(2)), "both groups' first life")
    dist.barrier()
    trainer = _trainer(spec, rank, group, address, group)  # group 1: its second start in this attempt
    trainer.restore()
    joined = _digest(trainer)
    while trainer.state.step < STEPS:
        trainer.step(trainer.state.step)
    trainer.fedavg.close()
    trainer.watchdog.close()
    return joined, _digest(trainer)


def test_a_group_restarted_before_its_peers_trained_waits_for_them_and_heals_from_the_step_they_resumed(tmp_path):
    """Group 1 restarted from nothing while group 0 resumed from step 4: group 1 writes its ready mark (else group 0
    would wait train.timeout_s for it), and torchft, counting from each group's training step, sees it behind and
    heals it to group 0's resumed state, instead of averaging a fresh model into a trained one."""
    got = _run_groups(_resumed_rank, 2, 5.0, str(tmp_path))
    for rank in range(2):
        (joined0, end0), (joined1, end1) = got[0][rank], got[1][rank]
        assert joined0[0] == 4 and joined1 == joined0, (joined0, joined1)
        # both trained on and averaged to the last step: one model (AdamW's moments stay each group's own)
        assert end1[:3] == end0[:3] and end0[0] == STEPS


def _paused_rank(rank, world, group, address, run_dir):
    """Groups 1 and 2 of three are lost after step 1 and restart from nothing while group 0, which has not averaged
    since the first round, pauses well past the grace window before its step-2 average. Returns (step, digest)
    after each step, and a restarted group's digest where it healed."""
    import time

    spec = RunSpec.from_dict({**SPEC, "F": 3, "out_dir": run_dir})
    seen, trainer = [], _trainer(spec, rank, group, address, 0)
    trainer.restore()
    restarted = [Path(run_dir) / f"restarted{g}" for g in (1, 2)]
    while trainer.state.step < 4:
        trainer.step(trainer.state.step)
        seen.append(_digest(trainer))
        if trainer.state.step == 1 and group:
            _forget_manager(trainer, rank)
            restarted[group - 1].touch()
            trainer = _trainer(spec, rank, group, address, 1)
            trainer.restore()
            seen.append(["healed", *_digest(trainer)])
        elif trainer.state.step == 1:
            wait_for(lambda: all(p.exists() for p in restarted), "groups 1 and 2 restarting")
            time.sleep(PAUSE_S)
    trainer.fedavg.close()
    trainer.watchdog.close()
    return seen


PAUSE_S, GRACE_S = 3.0, 0.5


def test_restarted_groups_that_meet_without_a_peer_ahead_wait_to_heal_instead_of_training_from_nothing(tmp_path):
    """Two of three groups lost before the first average while the third is busy well past the grace window: the
    two restarted ones, a majority, meet in quorums of their own where no one is ahead to heal from. They must
    neither train on from their fresh state (all three would then stand at the same step at the next average, which
    would take a fresh model in as a trained one) nor fail: they ask again until the third comes, and heal to it."""
    got = _run_groups(_paused_rank, 3, GRACE_S, str(tmp_path))
    for rank in range(2):
        for group in (1, 2):
            healed = next(d[1:] for d in got[group][rank] if d[0] == "healed")
            # at group 0's step-2 average, or at the step-4 one when that round formed before this group asked again:
            # a peer's state there (group 0's, or the other restarted group's once it healed), never one of its own
            peers = [d for g in (0, 3 - group) for d in got[g][rank] if d[0] == healed[0]]
            assert healed[0] in (2, 4) and healed in peers, (group, healed, peers)


def _restarted_rank(rank, world, group, address, run_dir):
    """Every group started again (start 1), none holding anything of the run: returns the error its join raises."""
    from train.contract.common import FedshardError

    trainer = _trainer(RunSpec.from_dict({**SPEC, "out_dir": run_dir}), rank, group, address, 1)
    try:
        trainer.restore()
    except FedshardError as exc:
        return str(exc)
    finally:
        trainer.fedavg.close()
        trainer.watchdog.close()
    return None


def test_groups_that_were_all_started_again_fail_instead_of_training_again_from_step_0(tmp_path):
    """Nothing of the run is left to heal from (each group lost, none healed): each fails in its first round, so that
    a retry of the run resumes from the step the groups all checkpointed, not from nothing."""
    got = _run_groups(_restarted_rank, 2, GRACE_S, str(tmp_path))
    for group, errors in enumerate(got):
        assert errors == [f"federation group {group} was started again, as was every other group: none holds the "
                          f"run's state to heal from (a retry of the run resumes from the step the groups "
                          f"all checkpointed)"] * 2, errors


def _closing_rank(rank, world, group, address, run_dir):
    """Groups 0 and 1 of three train to the end (group 2 said it was ready but never came); rank 1 of each begins
    its closing rounds SKEW_S after rank 0, so the two ranks' train.timeout_s deadlines are that far apart. Returns
    how many groups the closing rounds left out."""
    import time

    spec = RunSpec.from_dict({**SPEC, "F": 3, "out_dir": run_dir, "train": {**SPEC["train"], "timeout_s": 4}})
    trainer = _trainer(spec, rank, group, address, 0)
    trainer.restore()
    while trainer.state.step < STEPS:
        trainer.step(trainer.state.step)
    if rank == 1:
        time.sleep(SKEW_S)
    trainer.fedavg.finish()
    trainer.fedavg.close()
    trainer.watchdog.close()
    return trainer.fedavg.left_out


SKEW_S = 2.0


def test_a_groups_ranks_leave_the_closing_rounds_together_whatever_their_clocks_say(tmp_path):
    """The leave after train.timeout_s is decided by the group, not by each rank's clock: rank 0 passes its deadline
    rounds before rank 1 does, and were it to leave alone, rank 1's next round would never form (torchft's round
    needs every rank of the group) and end in a timeout."""
    (tmp_path / lighthouse.READY.format(2)).touch()  # group 2's ready mark: the others start without waiting for it
    got = _run_groups(_closing_rank, 3, GRACE_S, str(tmp_path), running=2)
    assert got == [[1, 1], [1, 1]]


def test_a_job_that_loses_every_group_resumes_them_from_the_step_they_all_checkpointed(tmp_path):
    """The whole job lost (its one task killed: every group's ranks and the Lighthouse go with it): the retry starts
    every group afresh from the newest step all of them checkpointed, and trains the one-world run's losses."""
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny",
                                 "sweep.strategies=[fl_fsdp]", "train.fault_tolerance=groups", "sweep.train.steps=60",
                                 "train.checkpoint_every=8", "retries=1", f"results_dir={tmp_path / 'results'}"],
                                cwd=ROOT, env=clean_env(slurm_client=False), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    sweep = tmp_path / "results" / "local" / "smoke"
    run_dir, manifest = sweep / RUN, sweep / "manifest.jsonl"
    held = [run_dir / f"group{g}" / "checkpoints" / "step-000016" / "meta.json" for g in range(2)]
    wait_for(lambda: all(p.exists() for p in held) and manifest.exists(), "both groups' step-16 checkpoints",
             alive=lambda: launcher.poll() is None)
    job_pid = int(json.loads(manifest.read_text())["job_id"])  # the local executor's job id is its pid
    (task,) = children(job_pid)
    os.kill(task, signal.SIGKILL)
    out, err = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    assert "retrying 1 failed run(s)" in out
    entry = json.loads(manifest.read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2, entry
    result = RunResult.load(run_dir / "result.json")
    assert result.resumed_from_step >= 16 and result.resumed_from_step % 8 == 0
    assert [g["starts"] for g in result.groups] == [1, 1]  # each group's last life: the retry's
    assert [g["heals"] for g in result.groups] == [[], []]  # both resumed from the checkpoint, neither healed
    uninterrupted_like(run_dir / "spec.json", tmp_path / "reference")
    group0, group1, one = losses(run_dir / "group0"), losses(run_dir / "group1"), losses(tmp_path / "reference")
    assert [r[0] for r in group0] == [r[0] for r in group1] == [r[0] for r in one] == list(range(1, 61))
    for a, b, whole in zip(group0, group1, one):
        assert (a[1] + b[1]) / 2 == pytest.approx(whole[1], rel=1e-6)
