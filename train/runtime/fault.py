"""A fault injected on purpose (train.fault_step, train.fault_group; issue 56): after a given optimizer step of a
run's first attempt, the ranks of one federation group die as a lost node's would. Comparing layouts and recovery
paths on what a fault costs needs the same fault at the same step on the same seeds, which a test killing
processes from outside (at whichever step a log line happened to show) cannot give.

On SLURM each rank sets its own node DOWN first (`scontrol update`, which needs an operator's rights: the testbed
has them), so the scheduler sees a lost node, ends the job NODE_FAIL (or requeues it) and places no retry there;
on cluster=local the dead ranks fail the job as a crashed rank does. <run>/fault.json, written before anyone dies,
arms the fault once per run directory: a retry or a requeue of the same run trains through that step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from train.contract.common import write_atomic
from train.contract.spec import RunSpec

MARK = "fault.json"


class Fault:
    """This rank's part of the run's fault: `due(done)` after each step; `strike(done)` kills this rank."""

    def __init__(self, step: int, group: int):
        self.step, self.group = step, group

    @classmethod
    def armed(cls, spec: RunSpec, rank: int, out_dir: Path | None) -> "Fault | None":
        """The fault this rank takes part in: None without one, when this rank's group is not the one it kills,
        or when the run directory says it has struck already (a later attempt trains through it)."""
        t = spec.train
        if not t.fault_step or out_dir is None or spec.layout.coords(rank)[0] != t.fault_group:
            return None
        if (out_dir / MARK).exists():
            return None
        return cls(t.fault_step, t.fault_group)

    def due(self, done: int) -> bool:
        return done == self.step

    def strike(self, out_dir: Path, rank: int) -> None:
        """Record the fault, set this rank's SLURM node DOWN, and die (SIGKILL: nothing of the rank runs on)."""
        node = os.environ.get("SLURMD_NODENAME")
        now = time.time()
        write_atomic(out_dir / MARK, json.dumps({
            "step": self.step, "group": self.group, "time": now,
            "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds")}))
        if node is not None:
            down = subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                                   f"reason=fedshard fault at step {self.step}"],
                                  capture_output=True, text=True, timeout=30)
            if down.returncode:
                print(f"fedshard: rank {rank}: could not set node {node} DOWN for the injected fault: "
                      f"{(down.stderr or down.stdout).strip()}", file=sys.stderr, flush=True)
        print(f"fedshard: rank {rank} of federation group {self.group} killed after step {self.step} "
              f"(train.fault_step)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def record(out_dir: Path | None, resumed_from_step: int, resumed_at: float, tokens_per_step: int) -> dict | None:
    """result.json's `fault`: what <run>/fault.json says struck, and what it cost the attempt that resumed after it
    (steps and tokens trained again, seconds from the fault to the resume, on the clocks of the two ranks that
    wrote them); None when no fault struck, or when this attempt did not start after it."""
    mark = out_dir / MARK if out_dir is not None else None
    if mark is None or not mark.exists():
        return None
    fault = json.loads(mark.read_text())
    if resumed_at < fault["time"]:
        return None
    steps = fault["step"] - resumed_from_step
    return {"step": fault["step"], "group": fault["group"], "at": fault["at"], "resumed_from_step": resumed_from_step,
            "steps_retrained": steps, "tokens_retrained": steps * tokens_per_step,
            "fault_to_resume_s": round(resumed_at - fault["time"], 3)}
