"""The real SLURM testbed: daemons in network namespaces, shaped links, the launcher end to end.

Needs root, network namespaces and Debian's munge/slurmctld/slurmd/slurm-client. In CI (CI=true)
anything missing is a failure; elsewhere these tests skip and say why.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import ROOT, load_testbed, losses, uninterrupted_like, wait_for
from train.contract.result import RunResult
from train.contract.spec import identity

# Under pytest-xdist (-n) every testbed test runs on one worker: one testbed at a time on a machine.
pytestmark = pytest.mark.xdist_group("testbed")

TESTBED = [sys.executable, str(ROOT / "slurm" / "testbed" / "testbed.py")]
LAB = str(ROOT / "slurm" / "testbed" / "lab")
NAMESPACES = ["fsb-hub", "fsb-spine", "fsb-leaf1", "fsb-leaf2", "fsb-tb1", "fsb-tb2", "fsb-tb3", "fsb-tb4"]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc", "nsenter", "unshare", "munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install iproute2 munge slurmctld slurmd slurm-client)"
    if subprocess.run(["ip", "netns", "add", "fsb-probe"], capture_output=True).returncode:
        return "cannot create network namespaces here"
    subprocess.run(["ip", "netns", "del", "fsb-probe"], capture_output=True)
    if Path("/run/netns/fsb-hub").exists() and not load_testbed().stale():  # stale: `up` deletes them
        return "a testbed is already up on this machine (python slurm/testbed/testbed.py down)"
    return None


def _running_testbed(*up_args):
    """Bring a testbed up for the duration (fail in CI, skip elsewhere, when it cannot run here)."""
    why = _missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"testbed prerequisites missing in CI: {why}")
        pytest.skip(why)
    up = subprocess.run([*TESTBED, "up", *up_args], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield
    finally:
        subprocess.run([*TESTBED, "down"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def testbed():
    yield from _running_testbed()


def lab(*args, timeout=60, **kw):
    return subprocess.run([LAB, *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_up_shows_all_nodes_idle_and_the_switches(testbed):
    nodes = lab("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
    assert dict(zip(nodes[::2], nodes[1::2])) == {f"tb{i}": "idle" for i in range(1, 5)}
    topo = lab("scontrol", "show", "topology").stdout
    for line in ("SwitchName=leaf1 Level=0", "SwitchName=leaf2 Level=0", "SwitchName=spine Level=1"):
        assert line in topo, topo


def test_clients_outside_the_testbed_refuse(testbed, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "action=plan",
                           f"results_dir={tmp_path}"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "must be used from network namespace fsb-hub" in proc.stderr
    assert not (tmp_path / "testbed" / "smoke").exists()


@pytest.mark.slow
def test_launcher_end_to_end_with_ranks_reordered_by_topology(testbed, tmp_path):
    proc = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=1",
               "sweep.strategies=[fsdp,fl_hsdp]", "sweep.nodes=[4]", "sweep.F=[2]", f"results_dir={tmp_path}",
               timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = tmp_path / "testbed" / "smoke"
    entries = [json.loads(line) for line in (sweep / "manifest.jsonl").read_text().splitlines()]
    states = {e["run_id"]: e["state"] for e in entries}
    assert states == {"fsdp-F1-R1-S8": "COMPLETED", "fl_hsdp-F2-R2-S2-A2": "COMPLETED"}
    result = RunResult.load(sweep / "fl_hsdp-F2-R2-S2-A2" / "result.json")
    nodes = [r.node for r in sorted(result.ranks, key=lambda r: r.rank)]
    # leaf1 holds tb2 and tb4: federation group 0 lives there, so rank 0 is on tb2, not on tb1
    # (the allocation's first node, where srun put task 0) -- and the rendezvous still worked.
    assert nodes == ["tb2", "tb2", "tb4", "tb4", "tb1", "tb1", "tb3", "tb3"]
    assert {r.topology_addr for r in result.ranks} >= {"spine.leaf1.tb2", "spine.leaf2.tb1"}
    placement = (sweep / "placement.md").read_text()
    assert "| fl_hsdp-F2-R2-S2-A2 | 1.40 | 0.12 | 0.01 | ok |" in placement, placement
    assert "Table 3" in proc.stdout
    # What SLURM's accounting keeps is what a site's tooling trusts: every step of a completed run's job exits
    # 0:0 (no abort at interpreter exit): the job, its batch step and its srun step.
    for entry in entries:
        job = entry["job_id"]
        wait_for(lambda: f"{job}.0" in _exit_codes(job), f"sacct to record job {job}'s srun step", 60)
        assert set(_exit_codes(job).values()) == {"0:0"}, _exit_codes(job)



def _exit_codes(job: str) -> dict[str, str]:
    """sacct's ExitCode of a job and each of its steps (the batch step, the srun step), by JobID."""
    rows = lab("sacct", "-j", job, "-n", "-P", "-o", "JobID,ExitCode").stdout.split()
    return dict(row.split("|") for row in rows)


@pytest.mark.slow
def test_sacct_records_a_failed_run_with_a_nonzero_exit_once(testbed, tmp_path):
    """A run whose loss goes non-finite (lr 1e30) fails with a non-zero code in SLURM's accounting, once
    (NonFiniteError is not retried). A completed run's 0:0 is checked by the end-to-end test above."""
    _wait_idle()
    proc = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=1",
               "sweep.strategies=[fl_fsdp]", "sweep.nodes=[2]", "train.lr=1e30", "retries=1",
               f"results_dir={tmp_path}", timeout=900, cwd=ROOT)
    assert proc.returncode != 0 and "not retrying" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    [failed] = map(json.loads, (tmp_path / "testbed" / "smoke" / "manifest.jsonl").read_text().splitlines())
    assert failed["attempts"] == 1 and failed["state"] != "COMPLETED", failed
    wait_for(lambda: _exit_codes(failed["job_id"]).get(failed["job_id"], "0:0") != "0:0",
             "sacct to record the failed job", 60)


def test_prepare_runs_as_one_cpu_job_on_a_node(testbed, tmp_path, tiny_tokenizer):
    """action=prepare on SLURM: one task with prepare.workers CPUs on one node (sacct's record), no GPU asked,
    and the directory it writes is what train.data.prepare writes on this machine."""
    from train.data.prepare import INDEX, prepare

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"{i}.txt").write_text(" ".join(f"w{(i * 7 + j) % 100}" for j in range(200)))
    out = tmp_path / "tokens"
    proc = lab(sys.executable, "-m", "launcher", "action=prepare", "cluster=testbed", "data=tokens",
               f"data.path={out}", f"data.tokenizer={tiny_tokenizer}", f"prepare.sources=[{corpus}]",
               "prepare.workers=2", "poll_s=1", f"results_dir={tmp_path / 'results'}", timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    job = lines[0].split(" as job ")[1].split()[0]
    assert lines[-1].startswith(f"prepared {out}: 3 shard(s), 3 documents, 603 tokens (uint16)"), lines
    local, _ = prepare([str(corpus)], str(tiny_tokenizer), tmp_path / "here")
    assert json.loads((out / INDEX).read_text())["files"] == local["files"]
    wait_for(lambda: lab("sacct", "-j", job, "-X", "-n", "-P", "-o", "State").stdout.strip() == "COMPLETED",
             "sacct to record the preparation job", 60)
    cpus, nodes, tres = lab("sacct", "-j", job, "-X", "-n", "-P", "-o", "AllocCPUS,NNodes,AllocTRES").stdout \
        .strip().split("|")
    assert (cpus, nodes) == ("2", "1") and "gres" not in tres, tres


def _wait_idle(timeout_s=60):
    """Pinned nodes must be free: wait for the previous test's jobs to leave the nodes."""
    wait_for(lambda: set(lab("sinfo", "-h", "-o", "%T").stdout.split()) == {"idle"},
             "the testbed nodes to return to idle", timeout_s)


@pytest.mark.slow
def test_pinned_mode_orders_ranks_with_a_hostfile(testbed, tmp_path):
    _wait_idle()
    proc = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "cluster.placement=pinned",
               "model=tiny", "poll_s=1", "sweep.strategies=[fl_hsdp]", "sweep.nodes=[4]", "sweep.F=[2]",
               f"results_dir={tmp_path}", timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "testbed" / "smoke" / "fl_hsdp-F2-R2-S2-A2"
    assert (run_dir / "hostfile").read_text().split() == ["tb2", "tb2", "tb4", "tb4", "tb1", "tb1", "tb3", "tb3"]
    result = RunResult.load(run_dir / "result.json")
    assert [r.node for r in sorted(result.ranks, key=lambda r: r.rank)] == \
        ["tb2", "tb2", "tb4", "tb4", "tb1", "tb1", "tb3", "tb3"]


def test_capture_script_snapshot_plans_like_the_live_cluster(testbed, tmp_path):
    # Busy nodes (the previous test's job may still be ending) are fine for in-job placement.
    snap = tmp_path / "snap"
    cap = lab(str(ROOT / "slurm" / "capture.sh"), str(snap))
    assert cap.returncode == 0, cap.stderr
    assert "SwitchName=spine" in (snap / "topology.txt").read_text()
    live = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "action=plan",
               f"results_dir={tmp_path / 'live'}", cwd=ROOT)
    offline = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "action=plan",
                  f"cluster.snapshot={snap}", f"results_dir={tmp_path / 'offline'}", cwd=ROOT)
    assert live.returncode == offline.returncode == 0, live.stderr + offline.stderr
    plans = [json.loads((tmp_path / d / "testbed" / "smoke" / "plan.json").read_text())["runs"]
             for d in ("live", "offline")]
    assert [r["hostfile"] for r in plans[0]] == [r["hostfile"] for r in plans[1]]


# 200 steps: after a scancel at step 20 the tasks run on for KillWait (2 s) ignoring SIGTERM; the 180 steps left
# (about 10 s at the 55 ms median step of a whole suite here) must outlast it, or the cancelled job completes. In a
# whole suite at a3fd18e the cancelled attempt checkpointed step 100 before it was killed (with KillWait 10 s and
# 400 steps: step 200)
RESUME_SWEEP = ["sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=0.5", "sweep.strategies=[fl_fsdp]",
                "sweep.nodes=[2]", "sweep.train.steps=200", "sweep.train.log_every=10", "train.checkpoint_every=20",
                "train.stop_check_every=1", "retries=1"]
RESUME_RUN = "fl_fsdp-F2-R1-S2-A2"


_REFERENCES: dict[str, list] = {}


def _uninterrupted_losses(run_dir: Path, scratch: Path) -> list:
    """The losses of run_dir's spec trained uninterrupted (no injected fault) on forked local gloo ranks
    (tests/support.py) into scratch: the fault tests below share one identity (train.contract.spec.identity, which
    leaves out where a run writes and the fault it is dealt), so it is trained once per module."""
    key = json.dumps(identity(json.loads((run_dir / "spec.json").read_text())), sort_keys=True)
    if key not in _REFERENCES:
        uninterrupted_like(run_dir / "spec.json", scratch)
        _REFERENCES[key] = losses(scratch)
    return _REFERENCES[key]


def _start_sweep(results: Path, *overrides: str) -> subprocess.Popen:
    """The resume sweep (with `overrides` after its own), its launcher in the background."""
    command = [LAB, sys.executable, "-m", "launcher", *RESUME_SWEEP, *overrides, f"results_dir={results}"]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _fault_after_step_20(results: Path, launcher: subprocess.Popen, fault) -> None:
    """Once the run's step-20 checkpoint is written, apply fault(job_id)."""
    wait_for((results / "testbed" / "smoke" / RESUME_RUN / "checkpoints" / "step-000020").exists,
             "the step-20 checkpoint", alive=lambda: launcher.poll() is None)
    fault(json.loads((results / "testbed" / "smoke" / "manifest.jsonl").read_text())["job_id"])


def _finish(results: Path, launcher: subprocess.Popen) -> tuple[str, dict]:
    """The launcher's stdout once it ended (successfully) and the run's manifest entry."""
    out, err = launcher.communicate(timeout=600)
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    return out, json.loads((results / "testbed" / "smoke" / "manifest.jsonl").read_text())


def _sweep_with_fault(results: Path, fault, *overrides: str) -> tuple[str, dict]:
    """Run the resume sweep (with `overrides` after its own); once step 20 is checkpointed, apply fault(job_id).
    Returns stdout and the entry."""
    _wait_idle()
    launcher = _start_sweep(results, *overrides)
    try:
        _fault_after_step_20(results, launcher, fault)
        return _finish(results, launcher)
    finally:
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.slow
def test_scancel_then_retry_and_preemption_requeue_resume_with_the_samelosses(testbed, tmp_path):
    """The reference is the same spec trained uninterrupted on forked local gloo ranks (tests/support.py): the
    losses depend on the layout and the data, not on where the ranks run. The two sweeps run at once, each on 2 of
    the 4 nodes: their waits on SLURM (KillWait, a requeue's cred_expire) overlap."""
    cancelled, preempted = tmp_path / "cancelled", tmp_path / "preempted"
    _wait_idle()
    launchers = {results: _start_sweep(results) for results in (cancelled, preempted)}
    try:
        # scancel: the job is gone; the launcher retries the run as a new job, which resumes from step >= 20.
        _fault_after_step_20(cancelled, launchers[cancelled], lambda job: lab("scancel", job).check_returncode())
        # Pre-emption warning (what SLURM sends before preempting or at the time limit): every task checkpoints
        # the same step, submitit requeues the same job id, and it resumes there.
        _fault_after_step_20(preempted, launchers[preempted],
                             lambda job: lab("scancel", "--signal=USR2", job).check_returncode())
        (out, entry), (requeued_out, requeued) = (_finish(r, launchers[r]) for r in (cancelled, preempted))
    finally:
        for launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
    assert "retrying 1 failed run(s)" in out and entry["state"] == "COMPLETED" and entry["attempts"] == 2
    run_dir = cancelled / "testbed" / "smoke" / RESUME_RUN
    reference = _uninterrupted_losses(run_dir, tmp_path / "reference")
    assert RunResult.load(run_dir / "result.json").resumed_from_step >= 20
    # The retry was submitted only after the cancelled job's last task had stopped writing.
    retried_at = next((run_dir / "submitit" / "attempt2").glob("*_submitted.pkl")).stat().st_mtime
    assert max(p.stat().st_mtime for p in (run_dir / "submitit" / "attempt1").iterdir()) <= retried_at
    assert losses(run_dir) == reference

    assert requeued["state"] == "COMPLETED" and requeued["attempts"] == 1 and "retrying" not in requeued_out
    run_dir = preempted / "testbed" / "smoke" / RESUME_RUN
    result = RunResult.load(run_dir / "result.json")
    assert result.resumed_from_step >= 20
    assert lab("scontrol", "show", "job", requeued["job_id"]).stdout.count("Restarts=1") == 1
    assert losses(run_dir) == reference


def _sacct(job: str) -> str:
    """What submitit reads of a job: sacct's JobID, State and NodeList (tests/fixtures/job_states/ has these
    lines written by hand; the ones printed here are the testbed's own, to replace them with)."""
    return lab("sacct", "-j", job, "-o", "JobID,State,NodeList", "--parsable2").stdout


@pytest.mark.slow
def test_a_preempted_job_resumes_without_spending_a_retry(testbed, tmp_path):
    """PREEMPTED as SLURM means it (issue 57; submitit #1770). The testbed preempts by partition priority with
    PreemptMode=CANCEL (slurm/testbed/testbed.py): after the run's step-20 checkpoint a job of a higher-priority
    partition takes every node, SLURM ends the run's job PREEMPTED, and the launcher (retries=0, so a preemption
    counted as a failure would end the sweep FAILED) submits the run again at once; attempt 2 resumes from its
    checkpoint and ends with the losses of the same run trained uninterrupted."""
    jobs = []

    def preempt(job: str) -> None:
        jobs.append(job)
        urgent = ("-p", "urgent", "-N", "4", "-J", "urgent", "-o", "/dev/null")  # no slurm-N.out in the tree
        lab("sbatch", *urgent, "--wrap", "sleep 5").check_returncode()
        wait_for(lambda: lab("sacct", "-j", job, "-X", "-n", "-P", "-o", "State").stdout.strip() == "PREEMPTED",
                 "sacct to record the run's job PREEMPTED", 120)

    lab("scontrol", "create", "PartitionName=urgent", "Nodes=tb[1-4]", "PriorityTier=10", "MaxTime=INFINITE",
        "State=UP").check_returncode()
    try:
        out, entry = _sweep_with_fault(tmp_path / "preempted", preempt, "retries=0")
    finally:
        lab("scontrol", "delete", "PartitionName=urgent")
    print(_sacct(jobs[0]))
    assert "was preempted (SLURM: PREEMPTED); resubmitting it to resume from its last checkpoint" in out
    assert "retrying" not in out and "run(s) failed" not in out and ": FAILED" not in out, out[-3000:]
    assert (entry["state"], entry["attempts"], entry["preemptions"]) == ("COMPLETED", 2, 1), entry
    run_dir = tmp_path / "preempted" / "testbed" / "smoke" / RESUME_RUN
    assert RunResult.load(run_dir / "result.json").resumed_from_step >= 20
    assert losses(run_dir) == _uninterrupted_losses(run_dir, tmp_path / "reference")


@pytest.mark.slow
def test_a_node_failure_is_named_and_retried(testbed, tmp_path):
    """NODE_FAIL as SLURM means it (issue 57), from the fault fedshard injects (issue 56; tests/test_fault.py):
    after step 20 (and its checkpoint) federation group 1's ranks set their node DOWN and die. The job may not be
    requeued (--no-requeue; SLURM's own requeue after a node loss is
    test_a_node_lost_mid_run_shrinks_the_federation...'s path), so SLURM ends it NODE_FAIL; the launcher names the
    node failure and the node, and retries the run (retries=1) on the nodes left, from its checkpoint."""
    _wait_idle()
    try:
        launcher = lab(sys.executable, "-m", "launcher", *RESUME_SWEEP, "train.fault_step=20", "train.fault_group=1",
                       "+cluster.sbatch_extra.no_requeue=true", f"results_dir={tmp_path / 'node_fail'}", timeout=600,
                       cwd=ROOT)
    finally:  # the later tests need every node, whatever became of this one
        down = [line.split()[-1] for line in lab("sinfo", "-R", "-h", "-o", "%E %N").stdout.splitlines()
                if line.startswith("fedshard fault at step 20")]
        for node in down:
            lab("scontrol", "update", f"nodename={node}", "state=resume")
    assert launcher.returncode == 0, launcher.stdout[-3000:] + launcher.stderr[-3000:]
    out = launcher.stdout
    assert len(down) == 1, down  # group 1 is one node of S = 2 ranks
    failed = next(line for line in out.splitlines() if f"{RESUME_RUN}: FAILED" in line)
    assert "node failure (SLURM: NODE_FAIL)" in failed and f"lost node(s) {down[0]}" in failed, failed
    assert "retrying 1 failed run(s)" in out and "not retrying" not in out
    entry = json.loads((tmp_path / "node_fail" / "testbed" / "smoke" / "manifest.jsonl").read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2 and down[0] not in entry["nodes"], entry
    run_dir = tmp_path / "node_fail" / "testbed" / "smoke" / RESUME_RUN
    fault = json.loads((run_dir / "fault.json").read_text())
    assert (fault["step"], fault["group"]) == (20, 1)
    assert RunResult.load(run_dir / "result.json").resumed_from_step == 20
    assert losses(run_dir) == _uninterrupted_losses(run_dir, tmp_path / "reference")


SHRINK_RUN = "fl_fsdp-F4-R1-S2-A2"


@pytest.mark.slow
def test_a_node_lost_mid_run_shrinks_the_federation_and_the_loss_curve_goes_on(testbed, tmp_path):
    """retry_shrink: tb4 goes down after the step-20 checkpoint; SLURM requeues the job, which would wait for
    tb4; the launcher cancels it and resumes the run from its checkpoint on 3 federation groups. The tasks
    train on for KillWait (2 s, ~14 steps at the 145 ms median step of a whole suite here) after the node goes
    down: 120 steps keep the run from ending first on a faster machine."""
    _wait_idle()
    sweep = tmp_path / "testbed" / "smoke"
    launcher = subprocess.Popen(
        [LAB, sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=0.5",
         "sweep.strategies=[fl_fsdp]", "sweep.nodes=[4]", "sweep.train.steps=120", "sweep.train.log_every=10",
         "train.checkpoint_every=20", "train.stop_check_every=1", "retries=1", "retry_shrink=true",
         f"results_dir={tmp_path}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((sweep / SHRINK_RUN / "checkpoints" / "step-000020").exists, "the step-20 checkpoint",
                 alive=lambda: launcher.poll() is None)
        lab("scontrol", "update", "nodename=tb4", "state=down", "reason=fedshard-node-loss-test").check_returncode()
        out, err = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        lab("scontrol", "update", "nodename=tb4", "state=resume")
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    entry = json.loads((sweep / "manifest.jsonl").read_text())
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2, entry
    assert entry["shrunk"] == [{"attempt": 1, "lost": ["tb4"], "from": {"F": 4, "R": 1, "S": 2, "nodes": 4},
                                "to": {"F": 3, "R": 1, "S": 2, "nodes": 3}}]
    result = RunResult.load(sweep / SHRINK_RUN / "result.json")
    assert (result.F, result.world_size) == (3, 6) and "tb4" not in {r.node for r in result.ranks}
    [change] = result.layout_changes
    assert change["at_step"] >= 20 and change["streams_dropped"] == 2
    logged = losses(sweep / SHRINK_RUN)
    assert [step for step, _, _ in logged] == list(range(1, 121))  # every step logged once, across both attempts
    curve = {step: loss for step, loss, _ in logged}
    resumed = change["at_step"] + 1
    # No jump back to the initial loss: the first step on 3 groups is nearer the loss before the shrink.
    assert abs(curve[resumed] - curve[resumed - 1]) < abs(curve[resumed] - curve[1])
    print("loss across the shrink:", {s: round(curve[s], 3) for s in (1, resumed - 1, resumed, 120)})
    assert "(4,1,2) → (3,1,2)*" in (sweep / "table3.md").read_text() and "lost node(s) tb4" in out


FT_RUN = "fl_fsdp-F4-R1-S2-A2"


def _fault_downed(step: int) -> list[str]:
    """The nodes an injected fault after `step` set DOWN (train.runtime.fault)."""
    return [line.split()[-1] for line in lab("sinfo", "-R", "-h", "-o", "%E %N").stdout.splitlines()
            if line.startswith(f"fedshard fault at step {step}")]


@pytest.mark.slow
def test_a_lost_group_is_submitted_again_and_heals_while_the_others_train_on(testbed, tmp_path):
    """train.fault_tolerance=groups on SLURM (issue 56): one job per federation group, the Lighthouse in the launcher
    on the hub. After step 10 group 1's ranks set their node DOWN and die: SLURM ends that group's job NODE_FAIL
    only, the launcher submits it again, and it waits for a node; the node is returned to service 1 s later (a
    repaired node), and the new job heals from a live peer. No retry, no checkpoint: the other groups never stop
    longer than grace_s and a median step, and every group ends on the same model."""
    _wait_idle()
    sweep = tmp_path / "testbed" / "smoke"
    launcher = subprocess.Popen(
        [LAB, sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=0.5",
         "sweep.strategies=[fl_fsdp]", "sweep.nodes=[4]", "sweep.train.steps=60", "train.fault_tolerance=groups",
         "train.fault_step=10", "train.fault_group=1", "retries=0", f"results_dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((sweep / FT_RUN / "fault.json").exists, "the fault", alive=lambda: launcher.poll() is None)
        wait_for(lambda: len(_fault_downed(10)) == 1, "group 1's node to go DOWN", 30)
        time.sleep(1)
        for node in _fault_downed(10):
            lab("scontrol", "update", f"nodename={node}", "state=resume").check_returncode()
        out, err = launcher.communicate(timeout=600)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for node in _fault_downed(10):
            lab("scontrol", "update", f"nodename={node}", "state=resume")
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    assert "federation group 1's job" in out and "ended NODE_FAIL" in out and "submitted it again" in out, out
    assert "retrying" not in out
    entry = json.loads((sweep / "manifest.jsonl").read_text().splitlines()[-1])
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 1, entry
    assert [g["starts"] for g in entry["groups"]] == [1, 2, 1, 1], entry["groups"]
    result = RunResult.load(sweep / FT_RUN / "result.json")
    assert result.fault["healed_step"] > 10 and 0 < result.fault["fault_to_heal_s"] < 60, result.fault
    assert result.resumed_from_step == 0  # no checkpoint read: the group healed from a live peer
    rows = [json.loads(line) for line in (sweep / FT_RUN / "group0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 61))
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    assert max(gaps) < 5.0 + sorted(gaps)[len(gaps) // 2], gaps  # train.grace_s's default, and a median step
    final = {json.loads((sweep / FT_RUN / f"group{g}" / "evals.jsonl").read_text().splitlines()[-1])["eval_ppl"]
             for g in range(4)}
    assert len(final) == 1, final  # every group evaluates the one model they end on


@pytest.mark.slow
def test_a_lost_group_that_never_comes_back_is_left_out_once_the_others_end(testbed, tmp_path):
    """Group 1's node goes DOWN after step 10 and stays down: its new job waits for a node while the other groups hold
    the rest. They train to the end, wait train.timeout_s in their closing rounds, then leave together; the launcher
    cancels group 1's job and ends the run with their model, group 1 left out (not a wait until the time limit)."""
    _wait_idle()
    sweep = tmp_path / "testbed" / "smoke"
    try:
        proc = lab(sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=0.5",
                   "sweep.strategies=[fl_fsdp]", "sweep.nodes=[4]", "sweep.train.steps=30",
                   "train.fault_tolerance=groups", "train.fault_step=10", "train.fault_group=1", "train.timeout_s=20",
                   "retries=0", f"results_dir={tmp_path}", timeout=600, cwd=ROOT)
    finally:
        for node in _fault_downed(10):
            lab("scontrol", "update", f"nodename={node}", "state=resume")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ended NODE_FAIL" in proc.stdout and "federation group 1 had not come back" in proc.stdout, proc.stdout
    entry = json.loads((sweep / "manifest.jsonl").read_text().splitlines()[-1])
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 1, entry
    result = RunResult.load(sweep / FT_RUN / "result.json")
    assert [g["left_out"] for g in result.groups] == [False, True, False, False], result.groups
    per_step = 2 * result.batch_per_rank * result.seq_len  # one group's (R x S = 2 ranks)
    assert result.groups[1]["merged_tokens"] == 10 * per_step  # its steps up to its last average before the fault
    assert result.resumed_from_step == 0 and result.steps == 30
    final = {json.loads((sweep / FT_RUN / f"group{g}" / "evals.jsonl").read_text().splitlines()[-1])["eval_ppl"]
             for g in (0, 2, 3)}
    assert len(final) == 1, final  # the groups that ended hold one model
    assert "federation group 1 killed after step 10" in (sweep / "table3.md").read_text()
    assert "left out of the final model" in (sweep / "table3.md").read_text()
    wait_for(lambda: lab("squeue", "-h").stdout.strip() == "", "group 1's cancelled job to leave the queue", 30)


@pytest.mark.slow
def test_a_fault_tolerant_run_whose_launcher_died_goes_again_from_its_groups_checkpoint(testbed, tmp_path):
    """The Lighthouse of a fault-tolerant run lives in its launcher (launcher.actions.groups): once that launcher is
    killed, its group jobs can no longer average. The next launcher cancels them and runs the run again, every group
    from the newest step all of them checkpointed, each step logged once."""
    _wait_idle()
    sweep = tmp_path / "testbed" / "smoke"
    command = [LAB, sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "model=tiny", "poll_s=0.5",
               "sweep.strategies=[fl_fsdp]", "sweep.nodes=[4]", "sweep.train.steps=60", "train.fault_tolerance=groups",
               "train.checkpoint_every=20", f"results_dir={tmp_path}"]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        held = [sweep / FT_RUN / f"group{g}" / "checkpoints" / "step-000020" for g in range(4)]
        wait_for(lambda: all(p.exists() for p in held), "every group's step-20 checkpoint",
                 alive=lambda: first.poll() is None)
    finally:
        first.kill()  # SIGKILL: the launcher and, with it, the Lighthouse
        first.wait()
    again = lab(*command[1:], timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"cancelled {FT_RUN}'s group jobs" in again.stdout, again.stdout[-3000:]
    entry = json.loads((sweep / "manifest.jsonl").read_text().splitlines()[-1])
    assert entry["state"] == "COMPLETED" and entry["attempts"] == 2, entry
    run_dir = sweep / FT_RUN
    result = RunResult.load(run_dir / "result.json")
    assert result.resumed_from_step >= 20 and result.resumed_from_step % 20 == 0, result.resumed_from_step
    steps = [json.loads(line)["step"] for line in (run_dir / "group0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 61))
    assert lab("squeue", "-h").stdout.strip() == ""  # none of the first launcher's jobs is left


def _shape_node_link(node: str, leaf: str, rate: str) -> None:
    """Change `node`'s link to its leaf switch (both ends) to `rate` (slurm/testbed/testbed.py's htb class 1:10)."""
    for ns, dev in ((f"fsb-{node}", "eth0"), (f"fsb-{leaf}", node)):
        subprocess.run(["tc", "-n", ns, "class", "change", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
                        "rate", rate, "ceil", rate, "burst", "64k", "cburst", "64k"], check=True, capture_output=True)


@pytest.mark.slow
def test_preflight_names_the_node_whose_link_is_shaped_down(testbed, tmp_path):
    """tb4's link to leaf1 shaped from 1 Gbit to 20 Mbit: action=preflight on all four nodes names tb4, and nothing
    else, and says how to leave it out; with the link back, nothing is named. The seconds it took are printed (the
    issue's target: within 30 s; a time is measured, not asserted)."""
    _wait_idle()
    args = [sys.executable, "-m", "launcher", "sweep=smoke", "cluster=testbed", "sweep.nodes=[4]", "action=preflight",
            "preflight.bytes=262144", "preflight.iters=3", "poll_s=0.5"]
    try:
        _shape_node_link("tb4", "leaf1", "20mbit")
        started = time.monotonic()
        slow = lab(*args, f"results_dir={tmp_path / 'slow'}", timeout=300, cwd=ROOT)
        print(f"preflight named the shaped node {time.monotonic() - started:.1f} s after it was asked")
    finally:
        _shape_node_link("tb4", "leaf1", "1gbit")
    assert slow.returncode == 1, slow.stdout + slow.stderr
    found = json.loads((tmp_path / "slow" / "testbed" / "smoke" / "preflight.json").read_text())
    assert found["exclude"] == ["tb4"] and all("tb4" in line for line in found["named"]), found["named"]
    assert "cluster.sbatch_extra.exclude=tb4" in slow.stdout
    _wait_idle()
    well = lab(*args, f"results_dir={tmp_path / 'well'}", timeout=300, cwd=ROOT)
    assert well.returncode == 0, well.stdout + well.stderr


def test_teardown_leaves_no_process_or_namespace(testbed):
    pids = json.loads(Path("/tmp/fedshard-testbed/pids.json").read_text())
    inside = {ns: subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
              for ns in NAMESPACES}
    assert all(inside[ns] for ns in ("fsb-hub", "fsb-tb1")), inside  # slurmctld and a slurmd are running
    down = subprocess.run([*TESTBED, "down"], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not [ns for ns in NAMESPACES if Path(f"/run/netns/{ns}").exists()]
    started = {pid for pid, _ in pids.values()} | {int(p) for ps in inside.values() for p in ps}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(p) for p in started):
        time.sleep(0.2)
    assert not [p for p in started if _running(p)]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
