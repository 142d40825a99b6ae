"""`python -m train SPEC.json` for real: torchrun, SLURM-style env vars, submitit (bad input: test_bad_input.py)."""
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import submitit

from tests.support import clean_env
from train.contract.result import RunResult
from train.job import TrainJob


def _spec(tmp_path, **over):
    spec = {"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 1, "A": 3, "out_dir": str(tmp_path / "run"),
            "train": {"steps": 7, "seq_len": 16, "log_every": 3}}
    spec.update(over)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _check_result(run_dir: Path, world: int, steps: int, aggregations: int):
    result = RunResult.load(run_dir / "result.json")  # every key present, none unknown
    assert result.world_size == world and result.steps == steps
    assert result.aggregations == aggregations
    assert sorted(r.rank for r in result.ranks) == list(range(world))
    assert set(result.phases) == {"forward", "backward", "optimizer", "aggregation"}
    assert result.eval_ppl > result.floor_ppl > 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert sum(r["aggregated"] for r in rows) == steps // result.A  # plus the final average
    # Phases per step over the same steps, the first (warm-up) left out; aggregation per FedAvg event apart.
    timed = rows[1:]
    for name, stats in result.phases.items():
        assert stats.n == len(timed)
        assert stats.mean == pytest.approx(sum(r[name] for r in timed) / len(timed), rel=1e-9)
    events = [r["aggregation"] for r in timed if r["aggregated"]]
    assert result.aggregation_event.n == len(events)
    assert result.aggregation_event.mean == pytest.approx(sum(events) / len(events), rel=1e-9)
    return result


@pytest.mark.slow
def test_torchrun_four_ranks_fl_hsdp(tmp_path):
    spec = _spec(tmp_path, strategy="fl_hsdp", F=2, R=2, S=1)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4",
                           "-m", "train", str(spec)], env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 7/7" in proc.stdout
    # 7 steps with A=3: FedAvg after steps 3 and 6, plus the final average before evaluation.
    _check_result(tmp_path / "run", world=4, steps=7, aggregations=3)


@pytest.mark.slow
def test_slurm_env_rendezvous_on_rank0_host_without_master_addr(tmp_path):
    spec = _spec(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "train", str(spec)],
                              env=clean_env(SLURM_PROCID=str(r), SLURM_NTASKS="2", SLURM_LOCALID=str(r),
                                       SLURM_JOB_ID="4242", SLURM_TOPOLOGY_ADDR=f"spine.leaf1.node{r}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (1, 0)]  # rank 1 starts first and must wait for rank 0's address
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    result = _check_result(tmp_path / "run", world=2, steps=7, aggregations=3)
    assert sorted(r.topology_addr for r in result.ranks) == ["spine.leaf1.node0", "spine.leaf1.node1"]
    assert not list((tmp_path / "run").glob(".rendezvous-*")), "rendezvous file left behind"


@pytest.mark.slow
def test_submitit_local_executor_runs_the_picklable_job(tmp_path):
    spec = _spec(tmp_path)
    job_fn = pickle.loads(pickle.dumps(TrainJob(spec)))
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=10)
    job = executor.submit(job_fn)
    results = job.results()
    assert results[1] is None and results[0] == RunResult.load(tmp_path / "run" / "result.json")
    _check_result(tmp_path / "run", world=2, steps=7, aggregations=3)


def test_a_submitit_task_leaves_without_interpreter_finalization_after_its_run(tmp_path):
    """In a submitit task (SUBMITIT_FOLDER set, as submitit's process_job sets it) whose run returned, the
    process ends with status 0 before finalization, where freeing gloo groups can abort it: an abort queued
    for finalization here (atexit, registered first, so run last) never runs."""
    spec = _spec(tmp_path, strategy="fsdp", F=1, S=1, A=None)
    code = ("import atexit, os; atexit.register(os.abort); from train.job import TrainJob; "
            f"TrainJob({str(spec)!r})()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=clean_env(SUBMITIT_FOLDER=str(tmp_path / "submitit")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert RunResult.load(tmp_path / "run" / "result.json").steps == 7
