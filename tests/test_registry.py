"""Registered predictions: written once, before the first submission, and never replaced by a later plan."""
import json
from types import SimpleNamespace

from launcher.records.registry import Registry, before, load
from train.contract.layout import Layout


def entry(run_id, step):
    return SimpleNamespace(run_id=run_id, layout=Layout("fsdp", 1, 1, 4), model={"preset": "tiny"},
                           train={"seq_len": 32}, predicted_step_s=step, predicted_first_step_s=None,
                           predicted_step_bounds_s=[step / 2, step],
                           predicted_compute_s=step / 4, predicted_comm_by_group_s={"shard": step / 2},
                           predicted_exposed_comm_s={"shard": step / 4}, compute_source="measured by the probe")


def test_the_first_registration_stands(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text("{}")
    (tmp_path / "fsdp").mkdir()
    first = Registry(tmp_path, [entry("fsdp", 1.5)], "slurm", probe)
    assert first.register("fsdp") and not first.register("nothing-planned")
    record = json.loads((tmp_path / "fsdp" / "prediction.json").read_text())
    assert record["predicted_step_s"] == 1.5 and record["placement"] == "slurm" and record["model"] == "tiny"
    assert record["probe_sha256"] == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # of "{}"
    assert record["predicted_at"].endswith("+00:00") and record["seq_len"] == 32
    later = Registry(tmp_path, [entry("fsdp", 9.9)], "slurm", None)  # a retry, a re-plan
    assert not later.register("fsdp")
    assert load(tmp_path, ["fsdp", "other"])["fsdp"]["predicted_step_s"] == 1.5


def test_before_needs_both_times_and_compares_across_zones():
    assert before("2026-12-01T10:00:00+00:00", "2026-12-01T10:00:00+00:00")
    assert before("2026-12-01T10:59:00+01:00", "2026-12-01T10:00:00+00:00")
    assert not before("2026-12-01T10:00:01+00:00", "2026-12-01T10:00:00+00:00")
    assert not before(None, "2026-12-01T10:00:00+00:00") and not before("2026-12-01T10:00:00+00:00", None)
