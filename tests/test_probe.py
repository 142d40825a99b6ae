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


def _at_scale(rank, world):
    from train.measure.host_cost import collective_seconds, zero_layer_steps
    from train.measure.probe import measure, measure_groups

    rows = measure(rank, {"node": [[0, 1]]}, [1 << 10, 1 << 16], ("all_reduce",), iters=3)
    groups = measure_groups(rank, [{"collective": "all_gather", "groups": [[1, 0]], "sizes": [1 << 10, 1 << 16],
                                    "kinds": ["shard"], "runs": ["fsdp-F1-R1-S2"]}], iters=3)
    import torch.distributed as dist

    from train.measure.probe import _groups
    order = dist.get_process_group_ranks(_groups(rank, [[1, 0]], "cpu")[0])  # the given order, not sorted
    host = collective_seconds(("all_reduce", "all_gather"))
    fsdp = {"model": TINY, "batch_per_rank": 2, "seq_len": 16, "precision": "fp32", "strategy": "fsdp", "F": 1,
            "R": 1, "S": 2}
    zero = zero_layer_steps(rank, [fsdp, {**fsdp, "S": 3}], iters=2, budget_s=0.0)
    return rows, groups, host, zero, order


# smoke at tp = 1 and 2, in the report's order (the paper's strategies, then F, A and the run id)
RUN_IDS = ["fsdp-F1-R1-S2-T2", "fsdp-F1-R1-S4", "fl_fsdp-F2-R1-S1-A2-T2", "fl_fsdp-F2-R1-S2-A2"]
TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64}


def test_the_probe_keeps_distributions_times_given_groups_and_the_hosts_cost():
    """Issue 54, items 2 and 4, on 2 gloo ranks: every point keeps its calls' distribution (quantiles of every
    member's seconds, the slowest member per call with an interval); a run's own communicator is timed at its own
    sizes, its members in the order given (the run's ring, not the probe's rank order); a collective's host cost on
    a one-rank group; a 0-layer step with its layout's collectives on and off, their difference paired per round,
    and a layout the ranks cannot hold skipped."""
    results = run_ranks(_at_scale, 2)
    assert results[0] == results[1]  # the same numbers on every rank
    rows, groups, host, zero, order = results[0]
    assert order == [1, 0]  # a ring in the run's order (train.measure.probe._groups)
    for row in (*rows, *groups):
        assert len(row["dist"]) == len(row["points"]) == 2 and row["setup_s"] > 0  # its communicators created
        assert all(d["first_call_s"] > 0 for d in row["dist"])  # the warm-up call, a communicator's first use
        for (size, seconds), d in zip(row["points"], row["dist"]):
            assert d["bytes"] == size and d["iters"] >= 3 and len(d["quantiles_s"]) == 21
            assert d["quantiles_s"] == sorted(d["quantiles_s"])
            assert d["quantiles_s"][0] <= d["median_s"] <= d["quantiles_s"][-1] and d["median_s"] <= seconds
            lo, hi = d["slowest_interval_s"]
            assert 0 < lo <= d["slowest_median_s"] <= hi and d["median_s"] <= d["slowest_median_s"]
    [group] = groups
    assert group["ranks"] == 2 and group["kinds"] == ["shard"] and group["groups"] == [[1, 0]]
    assert set(host) == {"all_reduce", "all_gather"}
    assert all(0 < v["median_s"] < 0.1 and v["calls"] >= 20 for v in host.values())
    [z] = zero  # S = 3 does not divide 2 ranks: skipped
    assert (z["strategy"], z["S"], z["copies"], z["rounds"]) == ("fsdp", 2, 1, 9)
    for part in ("on", "off", "collectives"):
        assert set(z[part]) == {"forward_s", "backward_s", "optimizer_s", "step_s"}
        lo, hi = z["interval"][part]["step_s"]
        assert lo <= z[part]["step_s"] <= hi
    assert z["on"]["step_s"] > 0 and z["off"]["step_s"] > 0


def test_the_runs_groups_are_timed_on_the_seats_they_hold_in_the_run():
    """The testbed in fedshard's order: the plan numbers ranks tb2 tb2 tb4 tb4 (leaf1) tb1 tb1 tb3 tb3 (leaf2), the
    probe's ranks start in SLURM's order tb1 tb1 tb2 tb2 tb3 tb3 tb4 tb4. FL+HSDP (2,2,2)'s FedAvg pairs (f = 0, 1 at
    the same replica and shard) cross the trunk in the run, so they must in the probe: rank 0 of the plan (tb2's
    first) is the probe's rank 2, rank 4 (tb1's first) its rank 0. A seat the probe has not is left out."""
    from train.contract.layout import seats
    from train.job.probe import on_ranks_here

    planned = ["tb2", "tb2", "tb4", "tb4", "tb1", "tb1", "tb3", "tb3"]
    here = ["tb1", "tb1", "tb2", "tb2", "tb3", "tb3", "tb4", "tb4"]
    assert seats(planned)[:3] == [("tb2", 0), ("tb2", 1), ("tb4", 0)]
    pairs = [[0, 4], [1, 5], [2, 6], [3, 7]]  # in the plan's numbering
    fed = {"collective": "all_reduce", "seats": [[seats(planned)[r] for r in g] for g in pairs],
           "kinds": ["federation"]}
    [moved] = on_ranks_here([fed], here)
    assert moved == {"collective": "all_reduce", "kinds": ["federation"], "groups": [[2, 0], [3, 1], [6, 4], [7, 5]]}
    assert [[here[r] for r in g] for g in moved["groups"]] == [["tb2", "tb1"], ["tb2", "tb1"], ["tb4", "tb3"],
                                                              ["tb4", "tb3"]]
    assert on_ranks_here([fed], planned)[0]["groups"] == pairs  # where the probe stands as planned, nothing moves
    assert on_ranks_here([fed], here[:6] + ["tb5", "tb5"]) == []  # tb4's seats are not in the probe


def test_the_summary_places_the_runs_groups_and_prices_the_slowest_of_n(tmp_path):
    """summarise: each `scale` row gets the level its groups cross, the flows on that level's busiest link, its own
    fit, how it compares with the level's 2-rank fit at its ranks and flows (vs_level), and the expected slowest
    of its n ranks; a level row the slowest of each n the runs have there. read_probe still reads the file."""
    import json

    from launcher.actions.probe import summarise, table
    from launcher.placement import topology
    from launcher.placement.alphabeta import expected_max
    from launcher.prediction import read_probe

    tree = topology.to_json(topology.ideal(2, [1, 2]))
    hosts = ["node1", "node1", "node2", "node2"]
    flat = {"bytes": 0, "iters": 5, "median_s": 1e-3, "quantiles_s": [1e-3 + i * 1e-5 for i in range(21)],
            "slowest_median_s": 1.1e-3, "slowest_interval_s": [1e-3, 1.2e-3]}
    points = [[1024, 1e-3], [1 << 20, 1e-3 + (1 << 20) / 1e8]]
    raw = {"backend": "gloo", "hosts": hosts, "barrier_s": 1e-4, "compute": [], "layouts": [], "budget_s": 10.0,
           "levels": [{"level": "leaf", "collective": "all_gather", "ranks": 2, "points": points,
                       "dist": [flat, flat]}],
           "scale": [{"collective": "all_gather", "groups": [[0, 1, 2, 3]], "sizes": [1024, 1 << 20],
                      "kinds": ["shard"], "runs": ["fsdp-F1-R1-S4"], "ranks": 4,
                      "points": [[1024, 2e-3], [1 << 20, 2e-3 + 3 * (1 << 20) / 1e8]], "dist": [flat, flat]}],
           "host": {"collective_s": {"all_gather": {"median_s": 2e-5, "interval_s": [1e-5, 3e-5], "calls": 100}},
                    "zero_layer_steps": []}}
    probe = summarise(raw, tree)
    [row] = probe["scale"]
    assert row["level"] == "leaf" and row["flows"] == 1 and row["bytes_per_s"] > 0
    base = probe["levels"][0]
    priced = base["alpha_s"] + (1 << 20) * 3 / 4 / base["link_bytes_per_s"]
    assert row["vs_level"][1] == pytest.approx(row["points"][1][1] / priced)
    assert row["slowest_of_s"] == {"4": [expected_max(flat["quantiles_s"], 4)] * 2}
    assert set(base["slowest_of_s"]) == {"2", "4"} and base["slowest_of_s"]["2"][0] < base["slowest_of_s"]["4"][0]
    assert probe["host"] == raw["host"] and probe["budget_s"] == 10.0
    assert "leaf     all_gather          4 ranks x 1 groups (shard: fsdp-F1-R1-S4)" in table(probe)
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    assert read_probe(tmp_path / "probe.json")["scale"] == probe["scale"]


@pytest.mark.slow
def test_action_validate_probes_plans_and_runs_with_registered_predictions(tmp_path):
    """`python -m launcher action=validate` on cluster=local: probe -> plan -> runs -> report in one command. The
    probe, a job on the widest run's ranks with its progress echoed, writes probe.json with a fit per (level,
    collective), the compute of each workload, each layout's stage measured in place (tp = 1 and 2) and probe.png;
    the plan prices every run from it; every prediction compared is registered, made with the calibration of this
    very job; a second validation on the same directory, or a hand-picked probe, is refused. (action=probe is the
    same probe alone, launcher.actions.probe: one command covers both: `action=probe` alone took 38 s here.)"""
    import csv
    import json
    import subprocess
    import sys

    from tests.support import clean_env

    def launcher(*args):
        return subprocess.run([sys.executable, "-m", "launcher", "sweep=smoke", "model=tiny", "train.seq_len=128",
                               "sweep.tp=[1,2]", *args, f"results_dir={tmp_path}"], capture_output=True, text=True,
                              timeout=900, env=clean_env(slurm_client=False))

    proc = launcher("action=validate", "probe.max_bytes=16777216", "probe.iters=3", "probe.budget_s=2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    sweep = tmp_path / "local" / "smoke"
    assert "probe written to" in proc.stdout and proc.stdout.index("probe written to") < proc.stdout.index("submitted")
    probe = json.loads((sweep / "probe.json").read_text())
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
        for phase, value in compute[part].items():  # medians over rounds, inside their intervals, never clamped
            lo, hi = compute["interval"][part][phase]
            assert lo <= value <= hi
    assert all(v > 0 for v in compute["root"].values())
    assert compute["depths"] == [0, 1, 2, 4] and compute["rounds"] >= 9 and compute["spread"]["forward_backward"] >= 0
    assert "forward+backward within ±" in proc.stdout and "rounds of 4 depths (medians shown)" in proc.stdout
    # the runs' own groups at their own sizes: FSDP's 4-rank shard group across both nodes, its units' buffers
    [fsdp] = [e for e in probe["scale"] if e["collective"] == "all_gather" and e["ranks"] == 4]
    assert fsdp["kinds"] == ["shard"] and fsdp["level"] == "leaf" and len(fsdp["points"]) >= 3
    assert fsdp["vs_level"] and all(v > 0 for v in fsdp["vs_level"]) and "4" in fsdp["slowest_of_s"]
    assert all(len(d["quantiles_s"]) == 21 for e in probe["levels"] for d in e["dist"])
    assert set(probe["host"]["collective_s"]) == set(COLLECTIVES) and probe["budget_s"] == 2
    assert {(z["strategy"], z["S"]) for z in probe["host"]["zero_layer_steps"]} == {("fsdp", 4), ("fl_fsdp", 2)}
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
        assert stage["one"]["forward_s"] + stage["one"]["backward_s"] > 0 and stage["rounds"] >= 9
        assert f"probe: compute of layout pp=1 tp={tp} at {batch}x128 tokens done" in proc.stdout
    assert "busbw (GB/s)" in proc.stdout  # "probe written to": checked above, before the first submission
    assert (sweep / "probe.png").read_bytes()[:4] == b"\x89PNG"

    # every run's prediction registered before it started, from this job's probe
    rows = list(csv.DictReader((sweep / "prediction.csv").open()))
    assert [r["run_id"] for r in rows] == RUN_IDS
    assert all(r["basis"] == "registered" and r["predicted_at"] <= r["started_at"] for r in rows)
    assert "registered predictions within ±20%" in (sweep / "prediction.md").read_text()

    # the sweep's plan reads the probe: measured compute, the probe's alpha/beta, and a step per run
    proc = launcher("action=plan")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads((sweep / "plan.json").read_text())
    assert plan["network"].startswith("probe ") and plan["network"].endswith("probe.json")
    assert [e["tp"] for e in plan["runs"]] == [1, 2, 1, 2]
    for e in plan["runs"]:
        full, none = e["predicted_step_bounds_s"]
        assert 0 < full <= none and e["predicted_step_s"] <= none * (1 + 1e-9)  # CPU: the sum, cores shared
        assert e["predicted_compute_s"] > 0 and e["predicted_tokens_per_s"] > 0
        # the stage step as measured (one layer, then each further layer), the optimizer on the rank's 1/S and the
        # host's cost of the step's collective calls (on CPU the same cores' work), at most: the probe timed the
        # stage with every rank computing at once, a run's ranks also wait on collectives and share the cores less
        # (launcher.placement.schedule.Cores). Calls per step at most: per FSDP unit (embedding, layers, head) two
        # all-gathers, a reduce-scatter and an all-reduce, the exchange's calls, and at tp = 2 seven all-reduces
        # per layer and two for lm_head
        between = ", its CPU seconds over the shared cores between averages"  # launcher.prediction.between_averages
        assert e["compute_source"] in ("the layout's stage measured in place by the probe",
                                       "the layout's stage measured in place by the probe" + between)
        assert e["compute_source"].endswith(between) <= (e["strategy"] != "fsdp" and e["A"] > 1)
        stage = stages[e["tp"]]
        assert stage["cpu"]["one"] > 0  # the mean rank's CPU seconds in the stage step
        whole = {k: stage["one"][k] + (layers - 1) * stage["layer"][k] for k in stage["one"]}
        calls = 4 * (layers + 2) + 2 + (7 * layers + 2) * (e["tp"] > 1)
        host = max(c["median_s"] for c in probe["host"]["collective_s"].values()) * calls
        assert e["predicted_compute_s"] <= (whole["forward_s"] + whole["backward_s"]
                                            + whole["optimizer_s"] / e["S"] + host) * (1 + 1e-9)
        assert "tensor" not in e["predicted_comm_by_group_s"]  # inside the measured stage step
    assert "the layout's stage measured in place by the probe" in proc.stdout
    assert "fastest layouts on 2 nodes" in proc.stdout

    again = launcher("action=validate")
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"fedshard: error: action=validate needs runs that have not run yet, but {sweep} holds results of 4 "
        f"(fsdp-F1-R1-S4, ...): use a fresh results_dir"]
    picked = launcher("action=validate", f"cluster.probe={sweep / 'probe.json'}")
    assert picked.returncode == 2 and "unset cluster.probe" in picked.stderr
