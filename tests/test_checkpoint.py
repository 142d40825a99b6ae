"""Exact resume: a run killed mid-way and started again gives the losses of an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.test_entrypoint import _env

STEPS, EVERY = 120, 20


def _spec(tmp_path: Path, name: str, **over) -> Path:
    spec = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 1, "A": 3, "out_dir": str(tmp_path / name),
            "train": {"steps": STEPS, "seq_len": 16, "log_every": 5, "checkpoint_every": EVERY}}
    spec.update(over)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def _torchrun(spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "-m", "train",
                             str(spec)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _losses(run_dir: Path) -> list[tuple]:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["aggregated"]) for r in rows]


def test_sigkill_of_a_rank_then_rerun_resumes_exactly(tmp_path):
    reference = _torchrun(_spec(tmp_path, "reference"))
    assert reference.wait(timeout=600) == 0, reference.stderr.read()[-2000:]

    spec = _spec(tmp_path, "killed")
    run_dir = tmp_path / "killed"
    first = _torchrun(spec)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "step-000040").exists():
        assert first.poll() is None and time.monotonic() < deadline, "never reached the second checkpoint"
        time.sleep(0.05)
    children = Path(f"/proc/{first.pid}/task/{first.pid}/children").read_text().split()
    os.kill(int(children[-1]), signal.SIGKILL)  # one rank dies; torchrun tears the others down
    assert first.wait(timeout=120) != 0
    assert not (run_dir / "result.json").exists()
    steps_before = len(_losses(run_dir))
    assert EVERY * 2 <= steps_before < STEPS
    # A checkpoint write that was interrupted must not be taken for the latest one.
    (run_dir / "checkpoints" / ".step-000100.tmp").mkdir()

    second = _torchrun(spec)
    assert second.wait(timeout=600) == 0, second.stderr.read()[-2000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] >= EVERY * 2
    assert _losses(run_dir) == _losses(tmp_path / "reference")  # bitwise: same losses, same FedAvg steps
    assert result["aggregations"] == json.loads((tmp_path / "reference" / "result.json").read_text())["aggregations"]


def test_resuming_with_another_layout_is_refused(tmp_path):
    spec = _spec(tmp_path, "run", train={"steps": 4, "seq_len": 16, "checkpoint_every": 2})
    assert _torchrun(spec).wait(timeout=600) == 0
    # The run finished (result.json) but its checkpoints remain: a different layout must not load them.
    other = _spec(tmp_path, "run", strategy="fl_fsdp", F=4, R=1, S=1, train={"steps": 4, "seq_len": 16})
    proc = _torchrun(other)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode != 0 and "resuming with another layout is refused" in err


def test_submitit_requeues_the_same_job_on_preemption(tmp_path):
    from train.__main__ import TrainJob

    job = TrainJob(str(tmp_path / "spec.json"))
    delayed = job.checkpoint()
    assert delayed.function is job  # requeued as is: it resumes from the run directory's latest checkpoint
