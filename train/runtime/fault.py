"""A fault injected on purpose (train.fault_step, fault_group, fault_kind; issue 56): after a given optimizer step of
a run's first attempt, the ranks of one federation group die as a lost node's would (kill), or from then on run at
a fraction of their speed (slow). Comparing layouts and recovery paths on what a fault costs needs the same fault
at the same step on the same seeds, which a test acting from outside (at whichever step a log line happened to
show) cannot give.

kill: on SLURM each rank sets its own node DOWN first (`scontrol update`, which needs an operator's rights: the
testbed has them), so the scheduler sees a lost node, ends the job NODE_FAIL (or requeues it) and places no retry
there; on cluster=local the dead ranks fail the job as a crashed rank does. slow: each rank of the group starts a
throttle (train.runtime.throttle) that stops and continues it, as a CPU quota does, until the rank ends.
<run>/fault.json, written before the fault strikes, arms it once per run directory: a retry or a requeue of the
same run trains through that step unharmed."""
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
    """This rank's part of the run's fault: `due(done)` after each step; `strike()` when it is."""

    def __init__(self, step: int, group: int, kind: str, speed: float):
        self.step, self.group, self.kind, self.speed = step, group, kind, speed

    @classmethod
    def armed(cls, spec: RunSpec, rank: int, out_dir: Path | None) -> "Fault | None":
        """The fault this rank takes part in: None without one, when this rank's group is not the one it strikes,
        or when the run directory says it has struck already (a later attempt trains through it)."""
        t = spec.train
        if not t.fault_step or out_dir is None or spec.layout.coords(rank)[0] != t.fault_group:
            return None
        if (out_dir / MARK).exists():
            return None
        return cls(t.fault_step, t.fault_group, t.fault_kind, t.fault_speed)

    def due(self, done: int) -> bool:
        return done == self.step

    def strike(self, out_dir: Path, rank: int) -> None:
        """Record the fault, then kill this rank (its SLURM node set DOWN first) or start throttling it. Every rank of
        the group does both, once per run: the record exists whichever rank dies first, and each node is set DOWN by
        its own ranks (a rank knows only its own node)."""
        now = time.time()
        write_atomic(out_dir / MARK, json.dumps({
            "kind": self.kind, "step": self.step, "group": self.group, "time": now,
            "at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
            **({"speed": self.speed} if self.kind == "slow" else {})}))
        if self.kind == "slow":
            subprocess.Popen([sys.executable, "-m", "train.runtime.throttle", str(os.getpid()), str(self.speed)])
            print(f"fedshard: rank {rank} of federation group {self.group} runs at {self.speed:g} of its speed "
                  f"from step {self.step} on (train.fault_kind=slow)", file=sys.stderr, flush=True)
            return
        node = os.environ.get("SLURMD_NODENAME")
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
    """result.json's `fault`: what <run>/fault.json says struck and, for a kill, what it cost the attempt that
    resumed after it (steps and tokens trained again, seconds from the fault to the resume, on the clocks of the
    two ranks that wrote them); None when no fault struck, or when a kill struck after this attempt started."""
    mark = out_dir / MARK if out_dir is not None else None
    if mark is None or not mark.exists():
        return None
    fault = json.loads(mark.read_text())
    seen = {k: fault[k] for k in ("kind", "step", "group", "at", "speed") if k in fault}
    if fault["kind"] == "slow":
        return seen
    if resumed_at < fault["time"]:
        return None
    steps = fault["step"] - resumed_from_step
    return {**seen, "resumed_from_step": resumed_from_step, "steps_retrained": steps,
            "tokens_retrained": steps * tokens_per_step, "fault_to_resume_s": round(resumed_at - fault["time"], 3)}
