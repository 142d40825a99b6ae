"""train.profile=START:STOP: torch.profiler over steps START to STOP-1 (0-based, as Python slices), one trace per
rank in Chrome/Perfetto format (chrome://tracing, ui.perfetto.dev) at <run>/profile/rank<R>.json. The profiler
slows the steps it records, so a profiled run's step times are not the layout's: profile a run of its own. Traces
are written after training, outside the training time."""
from __future__ import annotations

from pathlib import Path

from train.contract.common import atomic  # torch is imported where a profile starts
from train.contract.config import profile_window

TRACE_DIR = "profile"


def trace_name(rank: int) -> str:
    return f"{TRACE_DIR}/rank{rank}.json"


class StepProfiler:
    """Starts the profiler before step START, stops it after step STOP-1; a run resumed past START profiles the
    steps of the window it still runs."""

    def __init__(self, text: str, steps: int, device: str):
        self.window = profile_window(text, steps)
        self.device = device
        self.prof = None
        self.stopped = False
        self.recorded: list[int] = []

    def before(self, step: int) -> None:
        if self.window and self.prof is None and self.window[0] <= step < self.window[1]:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities, record_shapes=True)
            self.prof.start()
        if self.prof is not None and step < self.window[1]:
            self.recorded.append(step)

    def after(self, step: int) -> None:
        if self.prof is not None and step == self.window[1] - 1:
            self.prof.stop()
            self.stopped = True

    def write(self, run_dir: Path, rank: int) -> bool:
        """Export this rank's trace; False when no step was profiled (a resume past the window)."""
        if self.prof is None:
            return False
        if not self.stopped:  # the run ended inside the window (a stop signal)
            self.prof.stop()
            self.stopped = True
        with atomic(run_dir / trace_name(rank)) as tmp:  # whole or absent
            self.prof.export_chrome_trace(str(tmp))
        return True
