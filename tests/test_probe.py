"""The probe on gloo ranks: every level and collective timed, points that an alpha-beta fit accepts."""
import pytest

from launcher.placement.alphabeta import COLLECTIVES, fit
from tests.support import run_ranks

SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24]  # 16 MiB: far above the jitter of 4 ranks on 2 cores
LEVELS = {"node": [[0, 1], [2, 3]], "leaf": [[0, 2], [1, 3]], "all": [[0, 1, 2, 3]]}


def _probe(rank, world):
    from train.measure.probe import measure

    return measure(rank, LEVELS, SIZES, COLLECTIVES, iters=5)


@pytest.mark.slow
def test_probe_times_every_level_and_collective_on_gloo_ranks():
    results = run_ranks(_probe, 4)
    assert all(r == results[0] for r in results)  # every rank returns the slowest rank's numbers
    rows = results[0]
    assert [(r["level"], r["collective"]) for r in rows] == [(lv, c) for lv in LEVELS for c in COLLECTIVES]
    for row in rows:
        assert row["ranks"] == len(LEVELS[row["level"]][0])
        sizes = [b for b, _ in row["points"]]
        assert sizes == sorted(sizes) and all(b % (4 * row["ranks"]) == 0 for b in sizes)
        assert all(t > 0 for _, t in row["points"])
        # a 16 MiB buffer takes longer than a 1 KiB one on any link, whatever the noise
        assert row["points"][-1][1] > row["points"][0][1], row
    assert fit([tuple(p) for p in rows[2]["points"]]).bytes_per_s > 0  # node all_reduce


@pytest.mark.slow
def test_action_probe_end_to_end_on_local_ranks(tmp_path):
    """`python -m launcher action=probe` on cluster=local: a job on the widest run's ranks, progress echoed,
    probe.json with a fit per (level, collective), the compute of each workload, the tp = 2 layout's stage
    measured in place, probe.png; the next plan prices every run from it."""
    import json
    import subprocess
    import sys

    from tests.support import clean_env

    sweep = ["sweep=smoke", "train.seq_len=128", "sweep.tp=[1,2]", f"results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "launcher", *sweep, "action=probe", "probe.max_bytes=16777216",
                           "probe.iters=3"], capture_output=True, text=True, timeout=600,
                          env=clean_env(slurm_client=False))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    probe = json.loads((tmp_path / "local" / "smoke" / "probe.json").read_text())
    assert probe["backend"] == "gloo" and probe["hosts"] == ["node1", "node1", "node2", "node2"]
    assert [(e["level"], e["collective"]) for e in probe["levels"]] == \
        [(lv, c) for lv in ("node", "leaf") for c in COLLECTIVES]
    for e in probe["levels"]:
        assert e["ranks"] == 2 and len(e["points"]) == 8  # 1 KiB .. 16 MiB
        assert e["alpha_s"] >= 0 and e["bytes_per_s"] > 0 and e["bus_bytes_per_s"] > 0
        # node: one pair per (virtual) node; leaf: both positions' pairs leave each node
        assert e["flows"] == {"node": 1, "leaf": 2}[e["level"]]
        assert e["link_bytes_per_s"] == e["bus_bytes_per_s"] * e["flows"]
    # one model and precision; a tp = 2 rank's data-parallel rank takes twice the batch
    assert [(c["batch_per_rank"], c["seq_len"], c["precision"]) for c in probe["compute"]] == \
        [(4, 128, "fp32"), (8, 128, "fp32")]
    compute = probe["compute"][0]
    for part in ("root", "layer"):
        assert set(compute[part]) == {"forward_s", "backward_s", "optimizer_s"}
        assert all(v > 0 for v in compute[part].values())  # measured, not clamped to 0
    assert len(compute["repeats"]) == 5 and compute["spread"]["forward_backward"] >= 0  # repeated, spread reported
    assert "forward+backward within ±" in proc.stdout and "over 5 repeats (medians shown)" in proc.stdout
    assert "probe: leaf broadcast on 2 ranks, 8 sizes done" in proc.stdout  # progress, echoed while it ran
    layers = compute["model"]["num_hidden_layers"]
    assert f"probe: compute of {layers}-layer model at 4x128 tokens (fp32) done" in proc.stdout
    # every run's step measured in place, once per distinct layout: FSDP (1,1,4) and FL+FSDP (2,1,2) at tp = 1
    # share one, FSDP (1,1,2) and FL+FSDP (2,1,1) at tp = 2 another
    stages = {s["tp"]: s for s in probe["layouts"]}
    assert len(probe["layouts"]) == 2
    for tp, batch in ((1, 4), (2, 8)):
        stage = stages[tp]
        assert {k: stage[k] for k in ("batch_per_rank", "seq_len", "pp", "microbatches", "sequence_parallel")} == \
            {"batch_per_rank": batch, "seq_len": 128, "pp": 1, "microbatches": 1, "sequence_parallel": False}
        assert stage["one"]["forward_s"] + stage["one"]["backward_s"] > 0 and len(stage["repeats"]) == 5
        assert stage["layer"]["forward_s"] + stage["layer"]["backward_s"] > 0
        assert f"probe: compute of layout pp=1 tp={tp} at {batch}x128 tokens done" in proc.stdout
    assert "busbw (GB/s)" in proc.stdout and "probe written to" in proc.stdout
    assert (tmp_path / "local" / "smoke" / "probe.png").read_bytes()[:4] == b"\x89PNG"

    # the sweep's next plan reads the probe: measured compute, the probe's alpha/beta, and a step per run
    proc = subprocess.run([sys.executable, "-m", "launcher", *sweep, "action=plan"],
                          capture_output=True, text=True, timeout=300, env=clean_env(slurm_client=False))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads((tmp_path / "local" / "smoke" / "plan.json").read_text())
    assert plan["network"].startswith("probe ") and plan["network"].endswith("probe.json")
    assert [e["tp"] for e in plan["runs"]] == [1, 2, 1, 2]
    for e in plan["runs"]:
        full, none = e["predicted_step_bounds_s"]
        assert 0 < full <= none and e["predicted_step_s"] == none  # CPU: no overlap
        assert e["predicted_compute_s"] > 0 and e["predicted_tokens_per_s"] > 0
        # the stage step as measured (one layer, then each further layer) and the optimizer on the rank's 1/S
        assert e["compute_source"] == "the layout's stage measured in place by the probe"
        stage = stages[e["tp"]]
        whole = {k: stage["one"][k] + (layers - 1) * stage["layer"][k] for k in stage["one"]}
        assert e["predicted_compute_s"] == pytest.approx(whole["forward_s"] + whole["backward_s"]
                                                         + whole["optimizer_s"] / e["S"])
        assert "tensor" not in e["predicted_comm_by_group_s"]  # inside the measured stage step
    assert "the layout's stage measured in place by the probe" in proc.stdout
    assert "fastest layouts on 2 nodes" in proc.stdout


@pytest.mark.slow
def test_action_validate_probes_then_runs_with_registered_predictions(tmp_path):
    """probe -> plan -> runs -> report in one command: every prediction compared is registered, made with the
    calibration of this very job; a second validation on the same directory, or a hand-picked probe, is refused."""
    import csv
    import subprocess
    import sys

    from tests.support import clean_env

    def launcher(*args):
        return subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "train.seq_len=128",
                               *args, f"results_dir={tmp_path}"], capture_output=True, text=True, timeout=900,
                              env=clean_env(slurm_client=False))

    proc = launcher("action=validate", "probe.max_bytes=16777216", "probe.iters=3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep = tmp_path / "local" / "smoke"
    assert "probe written to" in proc.stdout and proc.stdout.index("probe written to") < proc.stdout.index("submitted")
    rows = list(csv.DictReader((sweep / "prediction.csv").open()))
    assert [r["run_id"] for r in rows] == ["fsdp-F1-R1-S4", "fl_fsdp-F2-R1-S2-A2"]
    assert all(r["basis"] == "registered" and r["predicted_at"] <= r["started_at"] for r in rows)
    assert "registered predictions within ±20%" in (sweep / "prediction.md").read_text()
    again = launcher("action=validate")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"fedshard: error: action=validate needs runs that have not run yet, but {sweep} holds results of 2 "
        f"(fsdp-F1-R1-S4, ...): use a fresh results_dir"]
    picked = launcher("action=validate", f"cluster.probe={sweep / 'probe.json'}")
    assert picked.returncode == 2 and "unset cluster.probe" in picked.stderr
