"""A rank that stops in the middle of a run fails it within seconds, naming ranks, phase and step."""
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import children, clean_env, steps_logged, wait_for


def _local_rank(pid: int) -> int | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for item in env:
        if item.startswith(b"LOCAL_RANK="):
            return int(item.split(b"=")[1])
    return None


@pytest.mark.slow
def test_a_stopped_rank_is_named_long_before_the_time_limit(tmp_path):
    spec = tmp_path / "spec.json"
    run_dir = tmp_path / "run"
    spec.write_text(json.dumps({"strategy": "fl_fsdp", "F": 2, "R": 1, "S": 2, "A": 4, "out_dir": str(run_dir),
                                "train": {"steps": 100000, "seq_len": 16, "log_every": 1, "watchdog_s": 5,
                                          "timeout_s": 600}}))
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "-m", "train",
                             str(spec)], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: steps_logged(run_dir) >= 5, "step 5", alive=lambda: proc.poll() is None)
    ranks = children(proc.pid)
    victim = next(p for p in ranks if _local_rank(p) == 2)
    os.kill(victim, signal.SIGSTOP)
    err = ""
    try:
        # the gloo timeout (600 s) would be far later; once a rank has named the stopped one, that rank is killed,
        # since torchrun would give a stopped process its 30 s of SIGTERM grace before SIGKILL
        deadline, ready = time.monotonic() + 120, selectors.DefaultSelector()
        ready.register(proc.stderr, selectors.EVENT_READ)
        while "fedshard: error: rank" not in err and ready.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stderr.readline()
            if not line:
                break
            err += line
        os.kill(victim, signal.SIGKILL)
        err += proc.communicate(timeout=120)[1]
    finally:
        for pid in ranks:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if "fedshard: error: rank" in line]
    assert lines, err[-3000:]
    assert "rank 2 is not responding" in lines[0] and " in phase " in lines[0] and " at step " in lines[0]
    assert not (run_dir / "result.json").exists()
