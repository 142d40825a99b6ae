"""Helpers the test modules share: a clean environment for child processes, waiting, and reading runs."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON_ONLY = os.path.dirname(sys.executable)  # a PATH with no SLURM client on it: a "laptop"
_LAUNCH_VARS = ("SLURM_", "SUBMITIT_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")


def load_testbed():
    """slurm/testbed/testbed.py as a module (a script, not a package member)."""
    spec = importlib.util.spec_from_file_location("testbed_script", ROOT / "slurm" / "testbed" / "testbed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env(slurm_client: bool = True, **extra) -> dict:
    """This environment without the variables of the launcher running pytest (SLURM, submitit, torchrun),
    with one OpenMP thread per process; without `slurm_client` the PATH holds only the Python interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if not slurm_client:
        env["PATH"] = PYTHON_ONLY
    return {**env, **extra}


def wait_for(predicate, what: str, timeout_s: float = 300.0, alive=lambda: True) -> None:
    """Poll until predicate() holds; fail at once if `alive()` turns false, or after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert alive(), f"the process ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def steps_logged(run_dir: Path) -> int:
    try:
        return len((run_dir / "metrics.jsonl").read_text().splitlines())
    except OSError:
        return 0


def losses(run_dir: Path) -> list[tuple]:
    """(step, loss, aggregated) of every logged step: what exact-resume tests compare with `==`."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["aggregated"]) for r in rows]


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def make_result(**fields):
    """A RunResult of a small finished run, any field replaced (for tests of what reads results)."""
    from train.contract.result import RunResult, Stats

    idle = Stats(None, None, 0)
    base = dict(run_id="fsdp-F1-R1-S4", strategy="fsdp", F=1, R=1, S=4, A=None, world_size=4, steps=8, seq_len=16,
                batch_per_rank=2, tokens=1024, train_time_s=10.0, tokens_per_s=102.4, tokens_per_s_per_device=25.6,
                train_ppl=60.0, eval_ppl=50.0, eval_time_s=0.5, floor_ppl=3.0,
                phases={p: idle for p in ("forward", "backward", "optimizer", "aggregation")},
                aggregation_event=idle, aggregations=0, timing="phases", precision="fp32", params=1000,
                peak_memory_bytes=10**6, mfu=None, device="cpu", backend="gloo", data={"kind": "synthetic"}, ranks=[])
    return RunResult(**{**base, **fields})


def uninterrupted(spec: dict):
    """`spec` trained from start to end on forkserver ranks (train.runtime.local_ranks), writing what `python -m train`
    writes into its out_dir (metrics.jsonl, evals.jsonl, checkpoints, result.json); returns the result. The
    reference an interrupted run is compared with, without each rank's ~4 s start of a fresh interpreter; the
    interrupted runs themselves go through the real entrypoint."""
    from train.contract.spec import RunSpec

    return run_ranks(_uninterrupted_rank, RunSpec.from_dict(spec).world_size, spec)[0]


def uninterrupted_like(spec_path: Path, out_dir: Path):
    """The run spec at spec_path (a launcher's <run dir>/spec.json, or a test's), trained uninterrupted into out_dir:
    with no injected fault (train.fault_step)."""
    raw = json.loads(spec_path.read_text())
    return uninterrupted({**raw, "out_dir": str(out_dir), "train": {**raw.get("train", {}), "fault_step": 0}})


def _uninterrupted_rank(rank: int, world: int, raw: dict):
    from train.contract.spec import RunSpec
    from train.loop import Trainer

    spec = RunSpec.from_dict(raw)
    out_dir = Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = Trainer(spec, rank, "cpu", out_dir=out_dir).run("gloo")
    if result is not None:
        result.save(out_dir / "result.json")
    return result


def run_ranks(fn, world: int, *args) -> list:
    """train.runtime.local_ranks.run_ranks with the tests' forkserver preload (tests/forked.py), so whichever test
    starts the forkserver, every later one finds the launcher imported too."""
    from tests import forked
    from train.runtime import local_ranks

    return local_ranks.run_ranks(fn, world, *args, preload=forked.PRELOAD)


def grid(F: int, R: int, S: int, P: int = 1, T: int = 1, A: int = 1):
    """The Layout of an (F, R, S) grid under the strategy that has it (federated when F > 1, replicated when R > 1;
    A where it averages): for tests of code that needs only the grid."""
    from train.contract.layout import Layout

    strategy = ("fl_" if F > 1 else "") + ("hsdp" if R > 1 else "fsdp")
    return Layout(strategy, F, R, S, A if F > 1 else None, P, T)
