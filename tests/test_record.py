"""The command that made a sweep (launcher.records.record): kept in its directory, and replayed by `action=report
results_dir=DIR` alone."""
import pytest

from launcher.records import record
from train.contract.common import ConfigError


def test_the_first_command_stays_first_and_a_different_one_is_appended(tmp_path):
    record.record(tmp_path, ["sweep=smoke", "train.lr=0.01"])
    record.record(tmp_path, ["sweep=smoke", "train.lr=0.01"])  # a resume with the same words: nothing new
    record.record(tmp_path, ["sweep=smoke", "train.lr=0.01", "retries=3"])
    assert (tmp_path / "command.txt").read_text().splitlines() == [
        "python -m launcher sweep=smoke train.lr=0.01", "python -m launcher sweep=smoke train.lr=0.01 retries=3"]


def test_report_of_a_sweep_directory_replays_its_record(tmp_path, capsys):
    sweep_dir = tmp_path / "testbed" / "validation_x"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "command.txt").write_text("python -m launcher sweep=testbed_validation cluster=testbed "
                                           "results_dir=results poll_s=1 action=validate 'sweep.A=[4]' "
                                           "sweep.name=validation_x\n")
    argv = ["action=report", f"results_dir={sweep_dir}"]
    assert record.recorded(argv) == (["sweep=testbed_validation", "cluster=testbed", "sweep.A=[4]",
                                      "sweep.name=validation_x", "action=report", f"results_dir={tmp_path}"],
                                     sweep_dir.resolve())
    assert "named by" in capsys.readouterr().out
    assert record.recorded([*argv, "sweep=smoke"]) == ([*argv, "sweep=smoke"], None)  # other words: as typed
    bare = ["action=report", f"results_dir={tmp_path}"]
    assert record.recorded(bare) == (bare, None)  # no record there
    record.check(sweep_dir, sweep_dir.resolve())
    with pytest.raises(ConfigError, match="names the sweep directory .*other"):  # a renamed copy
        record.check(tmp_path / "testbed" / "other", sweep_dir.resolve())
    (sweep_dir / "command.txt").write_text("rm -rf /\n")
    with pytest.raises(ConfigError, match="is not a `python -m launcher` command"):
        record.recorded(argv)
