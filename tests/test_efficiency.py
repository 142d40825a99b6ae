"""Efficiency fields of result.json: exposed communication from the time the training steps wait for collectives
(nothing runs after training for it), and energy from one counter reader per node (RAPL's sysfs format,
wraparound and pauses included; NVML through a test double of nvidia-ml-py's API)."""
import sys
import time
import types

import pytest
import torch
import torch.distributed as dist

from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.loop import Trainer
from train.measure import energy, exposed

COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_reduce", "all_gather", "broadcast", "barrier", "all_to_all_single", "send", "recv")


def _zone(root, name, uj, max_uj=1000_000_000):
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


def test_rapl_sums_the_packages_not_their_subzones_and_undoes_wraparound(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", 999_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", 5_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 7)  # the core sub-zone of package 0: counted inside it already
    counter = energy.RaplCounter(tmp_path)
    assert counter.read() == 0.0
    (p0 / "energy_uj").write_text("3000000\n")  # wrapped past 1e9 µJ: 1 J + 3 J
    (p1 / "energy_uj").write_text("7000000\n")  # +2 J
    assert counter.read() == pytest.approx(6.0)


def test_no_rapl_zone_or_an_unreadable_one_says_why(tmp_path):
    with pytest.raises(energy.Unavailable, match="no RAPL package zone under"):
        energy.RaplCounter(tmp_path)
    (_zone(tmp_path, "intel-rapl:0", 1) / "max_energy_range_uj").write_text("secret\n")
    with pytest.raises(energy.Unavailable, match="not readable"):
        energy.RaplCounter(tmp_path)


class _FakeNvml(types.ModuleType):
    """nvidia-ml-py's calls the counter makes, over a node of four GPUs of which the job's ranks use some."""

    class NVMLError(Exception):
        pass

    def __init__(self, millijoules: dict[str, int]):
        super().__init__("pynvml")
        self.millijoules = millijoules

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid: str):
        if uuid not in self.millijoules:
            raise self.NVMLError(f"Not Found: {uuid}")
        return uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        return self.millijoules[handle]


def test_one_reader_per_node_counts_every_gpu_its_nodes_ranks_use(monkeypatch):
    nvml = _FakeNvml({f"GPU-{i}": 1000 * (i + 1) for i in range(4)})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # four ranks on two machines, one GPU each (per-task binding: each rank sees only its own)
    machines, gpus = ["m1", "m1", "m2", "m2"], ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert energy.node_gpus(machines, gpus, 0) == ["GPU-0", "GPU-1"]
    assert energy.node_gpus(machines, gpus, 2) == ["GPU-2", "GPU-3"]
    assert energy.node_gpus(machines, [None] * 4, 0) == []  # CPU ranks
    counter = energy.open_counter("cuda", energy.node_gpus(machines, gpus, 0))
    assert counter.read() == 1.0 + 2.0  # joules of both GPUs of machine m1, not only the reader's own
    assert "2 GPU(s)" in counter.source
    nvml.millijoules["GPU-1"] += 5000
    assert counter.read() == 8.0
    with pytest.raises(energy.Unavailable, match="Not Found: GPU-9"):
        energy.NvmlCounter(["GPU-9"])
    with pytest.raises(energy.Unavailable, match="no GPU of this node"):
        energy.NvmlCounter([])


def test_meter_counts_the_training_windows_only():
    """A 100 W counter: 0.6 s running, 0.5 s paused (a checkpoint), 0.6 s running, sampled every 0.1 s."""
    watts = 100.0
    meter = energy.EnergyMeter(lambda: watts * time.perf_counter(), every_s=0.1)
    meter.start()
    time.sleep(0.6)
    meter.pause()
    time.sleep(0.5)
    meter.resume()
    time.sleep(0.6)
    joules = meter.stop()
    # no energy lost between samples: a lost 0.1 s window would be 8 % off; what is left is the scheduling gap
    # between reading the counter and the clock (milliseconds on a loaded machine)
    assert joules == pytest.approx(watts * meter.seconds, rel=1e-2)
    assert 1.15 < meter.seconds < 1.45  # the pause is left out


def test_a_window_under_a_second_is_not_a_measurement():
    meter = energy.EnergyMeter(time.perf_counter)
    meter.start()
    time.sleep(0.05)
    assert meter.stop() is None


def test_summary_adds_node_readers_and_names_a_node_without_a_counter():
    good = energy.summary([(100.0, "rapl: x"), (None, None), (300.0, "rapl: x"), (None, None)], tokens=8000,
                          seconds=2.0, devices=4)
    assert good == {"energy_j": 400.0, "avg_power_w_per_device": 50.0, "tokens_per_j": 20.0,
                    "energy_source": "rapl: x; 2 node reader(s)"}
    bad = energy.summary([(100.0, "rapl: x"), (None, "none: n2: no RAPL package zone under /sys")], 8000, 2.0, 4)
    assert bad["energy_j"] is None and bad["tokens_per_j"] is None
    assert bad["energy_source"] == "none: n2: no RAPL package zone under /sys"
    short = energy.summary([(None, "rapl: x")], 8000, 0.5, 4)
    assert short["energy_j"] is None and short["energy_source"].startswith("none: training ran under the 1 s")


def test_tensor_parallel_runs_are_not_measured_and_say_why():
    assert exposed.why_not("cpu", 1) is None and exposed.why_not("cuda", 1) is None
    assert exposed.why_not("cpu", 2).startswith("not measured: tp=2")


class _Stream:
    """A CUDA stream as the GPU timing sees it: an id, and events stamped with the device's clock when reached."""

    def __init__(self, ident: int, clock: list):
        self.cuda_stream, self.clock = ident, clock

    def record_event(self, event):
        event.at = self.clock[0]


class _Event:
    def __init__(self, enable_timing: bool):
        self.at = None

    def elapsed_time(self, other) -> float:
        return (other.at - self.at) * 1e3


def test_on_gpu_the_training_streams_stalls_are_timed_and_no_other_streams(monkeypatch):
    """The GPU path without a GPU: events bracket each wait of the training stream (a Work's wait, or a Stream
    wait_event), and the stall between them is the step's exposed communication; waits of FSDP2's own streams, or
    of a streamed exchange's, are not."""
    clock = [0.0]
    training, side = _Stream(1, clock), _Stream(2, clock)
    current = [training]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    blocked = exposed.Blocked("cuda")
    blocked._stream = training.cuda_stream

    def stall(seconds):
        def wait(waiter, *args):
            clock[0] += seconds  # the stream reaches the next event once what it waits for is done
        return wait

    blocked._timed_on_stream(stall(0.25))(object())  # a Work's wait on the training stream
    blocked._timed_on_stream(stall(0.5), stream_method=True)(training, _Event(True))
    blocked._timed_on_stream(stall(4.0), stream_method=True)(side, _Event(True))  # another stream waits
    current[0] = side
    blocked._timed_on_stream(stall(8.0))(object())  # a Work's wait inside the exchange stream's context
    pairs = blocked.take()
    assert len(pairs) == 2 and exposed.seconds(pairs) == pytest.approx(0.75)
    assert blocked.take() == []


def _run_and_count(rank, world, spec_dict):
    """The whole run, counting the collectives called after training but outside the final evaluation (the
    result's few reductions of numbers, no model traffic)."""
    spec = RunSpec.from_dict(spec_dict)
    trainer = Trainer(spec, rank, "cpu")
    calls, now = {"training": [], "after": []}, ["before"]
    for name in COLLECTIVES:
        setattr(dist, name, (lambda n, fn: lambda *a, **k: (calls.get(now[0], []).append(n), fn(*a, **k))[1])(
            name, getattr(dist, name)))

    def during(fn, phase: str):
        def call(*args):
            now[0] = phase
            try:
                return fn(*args)
            finally:
                now[0] = "after"
        return call

    trainer.train, trainer.evaluate = during(trainer.train, "training"), during(trainer.evaluate, "eval")
    return trainer.run("gloo"), calls, trainer.log.rows


@pytest.mark.parametrize("strategy,layout", [("fsdp", (1, 1, 2)), ("hsdp", (1, 2, 2))])
def test_exposed_communication_is_the_time_the_steps_wait_for_collectives(strategy, layout):
    F, R, S = layout
    spec = {"strategy": strategy, "F": F, "R": R, "S": S, "out_dir": "/nonexistent", "model": {"preset": "tiny"},
            "train": {"steps": 4, "seq_len": 32, "log_every": 2}}
    (result, calls, rows), *others = run_ranks(_run_and_count, F * R * S, spec)
    for _, c, _ in [(result, calls, rows)] + others:
        assert {"all_gather_single", "reduce_scatter_single"} <= set(c["training"])
        assert not {"all_gather_single", "reduce_scatter_single"} & set(c["after"])  # no gathered pass after it
    assert result.exposed_comm_method == exposed.METHOD["cpu"]
    assert all(0 < r["blocked_s"] < r["step_time"] for r in rows)  # every step waits, and does more than wait
    assert result.exposed_comm_s == pytest.approx(sum(r["blocked_s"] for r in rows[1:]) / 3)
    assert result.compute_only_s == pytest.approx(sum(r["step_time"] for r in rows[1:]) / 3 - result.exposed_comm_s)
    # steps 3 and 4 on the training clock: the steady state, without the first two steps' set-up (issue 54)
    assert result.steady_steps == 2 and result.steady_step_s == pytest.approx((rows[3]["elapsed_s"]
                                                                               - rows[1]["elapsed_s"]) / 2)
    if result.energy_j is None:  # this machine has no counter, or trained under a second: the reason is given
        assert result.energy_source.startswith("none: ") and result.tokens_per_j is None
    else:
        assert result.energy_source.startswith("rapl: ")
        assert result.tokens_per_j == pytest.approx(result.tokens / result.energy_j)
