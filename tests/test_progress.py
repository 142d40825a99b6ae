"""Progress while a sweep waits: the sweep-wide line and its time-left estimate, and W&B fed while runs train."""
import json
import sys
import types

import pytest

from launcher.progress import Running, duration, last_step, line, time_left


def test_last_step_reads_the_last_complete_line(tmp_path):
    assert last_step(tmp_path) == (0, 0.0)
    rows = [{"step": i, "elapsed_s": 0.5 * i, "loss": 1.0} for i in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "ela')
    assert last_step(tmp_path) == (3, 1.5)  # the line being written is not read


def test_last_step_of_fault_tolerant_groups_is_group_0s_until_the_run_merges_them(tmp_path):
    (tmp_path / "group0").mkdir()
    (tmp_path / "group0" / "metrics.jsonl").write_text(json.dumps({"step": 7, "elapsed_s": 2.0}) + "\n")
    assert last_step(tmp_path) == (7, 2.0)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 9, "elapsed_s": 3.0}) + "\n")
    assert last_step(tmp_path) == (9, 3.0)


def test_time_left_uses_each_runs_pace_and_the_mean_for_queued_runs():
    running = [Running("a", 10, 20.0, 40), Running("b", 5, 5.0, 10), Running("c", 0, 0.0, 10)]
    # a: 2 s/step x 30 left; b: 1 s/step x 5; c not started: mean pace 1.5 s/step x 10; queued: 1.5 x 20
    assert time_left(running, [20], sequential=True) == pytest.approx(60 + 5 + 15 + 30)
    assert time_left(running, [20], sequential=False) == pytest.approx(60)
    assert time_left([Running("a", 0, 0.0, 40)], [40], sequential=True) is None


def test_progress_line_names_done_running_queued_and_time_left():
    text = line(125.0, 1, 4, [Running("fsdp-F1-R1-S4", 12, 6.0, 40)], [40, 40], sequential=True)
    assert text == ("[2m05s] 1/4 done, running: fsdp-F1-R1-S4 step 12/40, queued: 2; "
                    "~0m54s of training left (start-up not measured yet; queue waits not included)")  # 0.5 x (28 + 80)
    # a finished run spent 30 s outside training: each of the 2 queued runs will too
    text = line(125.0, 1, 4, [Running("fsdp-F1-R1-S4", 12, 6.0, 40)], [40, 40], sequential=True, overhead_s=30.0)
    assert text.endswith("~1m54s left: 0m54s training, 1m00s start-up and evaluation (queue waits not included)")
    assert "time left: estimating" in line(3.0, 0, 1, [Running("x", 0, 0.0, 5)], [], sequential=True)
    assert duration(7322) == "2h02m"


class _Recorder:
    """Stands in for the wandb package: records what LiveRun hands it."""

    def __init__(self):
        self.inits, self.logged, self.finished, self.summary = [], [], [], {}

    def init(self, **kw):
        self.inits.append(kw)
        recorder = self

        class Run:
            summary = recorder.summary

            def log(self, row, step):
                recorder.logged.append((step, row["loss"]))

            def finish(self, exit_code):
                recorder.finished.append(exit_code)
        return Run()


def test_live_run_logs_rows_as_they_are_written(tmp_path, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=recorder.init))
    from launcher.report.wandb_log import LiveRun
    from launcher.settings.sections import Wandb

    run_dir = tmp_path / "fsdp-F1-R1-S4"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"

    def row(step):
        return json.dumps({"step": step, "loss": 10.0 - step, "elapsed_s": step}) + "\n"

    live = LiveRun(Wandb(enabled=True, mode="offline", project="fedshard"), "smoke", run_dir, {"strategy": "fsdp"})
    assert recorder.inits[0]["reinit"] == "create_new" and recorder.inits[0]["name"] == "fsdp-F1-R1-S4"
    assert live.feed() == 0  # nothing written yet
    metrics.write_text(row(1) + row(2) + row(3)[:10])
    assert live.feed() == 2 and recorder.logged == [(1, 9.0), (2, 8.0)]
    with metrics.open("a") as fh:
        fh.write(row(3)[10:] + row(4))
    assert live.feed() == 2 and [s for s, _ in recorder.logged] == [1, 2, 3, 4]
    metrics.write_text(row(1) + row(2) + row(3))  # a resume trimmed the file to its checkpoint's steps ...
    assert live.feed() == 0
    with metrics.open("a") as fh:  # ... and trains on: only the new steps are logged
        fh.write(row(4) + row(5))
    assert live.feed() == 1 and recorder.logged[-1] == (5, 5.0)
    live.finish(None)
    assert recorder.finished == [1]  # no result: the W&B run ends as failed
