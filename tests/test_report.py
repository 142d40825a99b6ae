"""Report tables and plots, from hand-made result files whose expected ratios are computed from the inputs."""
import csv
import dataclasses
import io
import json
import statistics
from types import SimpleNamespace

import pytest

from launcher.report.paper import LLAMA3_8B_PARAMS, reproduces_paper
from launcher.report.plots import plots
from launcher.report.results import group_repeats, load_results
from launcher.report.tables import Table, table3, table4
from launcher.report.write import LOCAL_NOTE, write_report
from train.contract.common import StateError
from train.contract.result import RunResult, Stats

PNG = b"\x89PNG\r\n\x1a\n"


def phase(mean, std=0.0, n=4):
    return {"mean": mean, "std": std, "n": n}


def stats(mean, std=0.0, n=4):
    return Stats(mean, std, n)


def result(run_id, strategy, F, R, S, A, time, eval_ppl, fwd=1.0, agg=None, world=4, params=1000, floor=3.0, **kw):
    """A test input read as train.loop's result.json is (RunResult.from_dict checks its shape)."""
    r = {"run_id": run_id, "strategy": strategy, "F": F, "R": R, "S": S, "A": A, "world_size": world, "steps": 8,
         "seq_len": 16, "batch_per_rank": 2, "tokens": 1024, "train_time_s": time, "tokens_per_s": 1024 / time,
         "tokens_per_s_per_device": 1024 / time / world, "train_ppl": eval_ppl * 1.1, "eval_ppl": eval_ppl,
         "eval_time_s": 0.5, "floor_ppl": floor,
         "phases": {"forward": phase(fwd), "backward": phase(2.0), "optimizer": phase(0.25),
                    "aggregation": phase(agg / A if agg is not None else 0.0, 0.05)},  # per step, as the paper
         "aggregation_event": phase(agg, 0.1, 2) if agg is not None else phase(None, None, 0),
         "aggregations": 2 if agg is not None else 0, "timing": "phases", "precision": "fp32", "params": params,
         "peak_memory_bytes": 10**6, "mfu": None, "device": "cpu", "backend": "gloo", "data": {"kind": "markov"},
         "ranks": [{"rank": 0, "host": "h", "topology_addr": None}]}
    r.update(kw)
    return RunResult.from_dict(r)


SWEEP = [  # written in an order unlike the report's
    result("fl_hsdp-F2-R2-S2-A8", "fl_hsdp", 2, 2, 2, 8, 20.0, 40.0, agg=0.3, world=8),  # no FSDP run of 8 ranks
    result("fl_fsdp-F2-R1-S2-A16", "fl_fsdp", 2, 1, 2, 16, 25.0, 80.0, agg=0.2),
    result("fl_fsdp-F2-R1-S2-A4-rep1", "fl_fsdp", 2, 1, 2, 4, 12.0, 24.0, fwd=1.0, agg=0.2),
    result("fl_fsdp-F2-R1-S2-A4-rep2", "fl_fsdp", 2, 1, 2, 4, 13.0, 26.0, fwd=3.0, agg=0.2),
    result("hsdp-F1-R2-S2", "hsdp", 1, 2, 2, None, 40.0, 60.0),
    result("fsdp-F1-R1-S4", "fsdp", 1, 1, 4, None, 100.0, 50.0, tokens_per_s=12345.6),
]
ORDER = ["fsdp-F1-R1-S4", "hsdp-F1-R2-S2", "fl_fsdp-F2-R1-S2-A4", "fl_fsdp-F2-R1-S2-A16", "fl_hsdp-F2-R2-S2-A8"]


def write_sweep(root, results):
    for r in results:
        run = root / r.run_id
        run.mkdir()
        r.save(run / "result.json")
        steps = [{"step": i, "loss": 5.0 - i * 0.3, "ppl": 150.0 / (i + 1), "lr": 1e-3, "forward": 0.1,
                  "backward": 0.2, "optimizer": 0.05, "aggregation": 0.0, "step_time": 0.35,
                  "aggregated": False, "elapsed_s": 0.35 * (i + 1)} for i in range(8)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return root


def column(table, name):
    return [row[table.columns.index(name)] for row in table.rows]


def csv_rows(table):
    return list(csv.DictReader(io.StringIO(table.to_csv())))


def test_load_sorts_by_run_id_and_group_merges_repeats(tmp_path):
    results = load_results(write_sweep(tmp_path, SWEEP))
    assert [r.run_id for r in results] == sorted(r.run_id for r in SWEEP)
    merged = {r["run_id"]: r for r in group_repeats(results)}
    assert set(merged) == set(ORDER)
    rep = merged["fl_fsdp-F2-R1-S2-A4"]
    assert rep["repeats"] == 2 and rep["train_time_s"] == 12.5 and rep["eval_ppl"] == 25.0
    assert rep["train_time_s_std"] == pytest.approx(statistics.stdev([12.0, 13.0]))
    assert rep["eval_ppl_std"] == pytest.approx(statistics.stdev([24.0, 26.0]))
    assert rep["tokens_per_s"] == pytest.approx((1024 / 12 + 1024 / 13) / 2)
    assert rep["F"] == 2 and isinstance(rep["F"], int) and rep["A"] == 4
    assert rep["runs"] == ["fl_fsdp-F2-R1-S2-A4-rep1", "fl_fsdp-F2-R1-S2-A4-rep2"]
    assert rep["phases"]["forward"] == stats(2.0, pytest.approx(1.0), 8)  # pooled: 4×1.0 and 4×3.0
    assert rep["phases"]["aggregation"].n == 8 and rep["aggregation_event"].n == 4
    single = merged["hsdp-F1-R2-S2"]
    assert single["repeats"] == 1 and single["train_time_s_std"] is None
    assert single["aggregation_event"] == Stats(None, None, 0)


def test_table3_order_ratios_and_none(tmp_path):
    t = table3(load_results(write_sweep(tmp_path, SWEEP)))
    assert column(t, "Strategy") == ["FSDP", "HSDP", "FL+FSDP", "FL+FSDP", "FL+HSDP"]
    assert column(t, "A") == [None, None, 4, 16, 8]
    # one eval set: its floor is a note, not a column of equal numbers; eval time is in Table 4
    assert "PPL floor" not in t.columns and "Eval time (s)" not in t.columns
    assert any(n.startswith("PPL floor (") and "for every run here" in n for n in t.notes)
    assert "n" in t.columns and "Paper time (s)" not in t.columns
    md = t.to_markdown()
    lines = {line.split(" | ")[1] + line.split(" | ")[2]: line for line in md.splitlines()[4:] if line.startswith("|")}
    # paired by seed: FSDP ran seed 1 only, so the one pair is 100 s / 12 s and 50 / 24 PPL, with no interval
    assert "| 8.33× | 2.08× |" in lines["(2,1,2)4"]
    assert "| 2 | 12.50 ± 6.35 |" in lines["(2,1,2)4"]  # 95 % half-width: t(0.975, 1 df) 12.706 x 0.707 / sqrt 2
    assert "| 1 | 100.00 | 12,346 |" in lines["(1,1,4)–"] and "| 1.00× | 1.00× |" in lines["(1,1,4)–"]
    assert "| 2.50× | 1.20× higher |" in lines["(1,2,2)–"]  # 100/40, 50/60: never "0.833× lower"
    assert "| 4.00× | 1.60× higher |" in lines["(2,1,2)16"]  # 100/25, 50/80
    assert "| – | – |" in lines["(2,2,2)8"]  # 8 ranks: no FSDP run of that size to compare with


def test_table3_csv_holds_raw_numbers(tmp_path):
    rows = csv_rows(table3(load_results(write_sweep(tmp_path, SWEEP))))
    fsdp, rep = rows[0], rows[2]
    assert float(fsdp["Tokens/s mean"]) == 12345.6 and fsdp["Tokens/s ci95"] == "" and fsdp["A"] == ""
    assert float(rep["Training time (s) mean"]) == 12.5 and rep["n"] == "2"
    assert float(rep["Training time (s) ci95"]) == pytest.approx(12.7062 * statistics.stdev([12.0, 13.0]) / 2 ** 0.5,
                                                                 rel=1e-4)
    assert float(rep["× faster than FSDP"]) == pytest.approx(100 / 12) and rep["× faster than FSDP low"] == ""
    assert rows[-1]["× faster than FSDP"] == ""
    plain = csv_rows(table3([SWEEP[-1]]))  # no repeats: one raw column per value, n still shown
    assert float(plain[0]["Training time (s)"]) == 100.0 and plain[0]["n"] == "1"


def test_table4_mean_std_cells_and_split_csv(tmp_path):
    t = table4(load_results(write_sweep(tmp_path, SWEEP)))
    md = t.to_markdown()
    assert "| 2.00 ± 1.00 |" in md  # pooled forward of the repeats
    assert "| 0.04 ± 0.05 | 0.30 ± 0.10 | 2 |" in md  # FL+HSDP aggregation per step (0.3/8), per FedAvg, events
    rows = csv_rows(t)
    assert float(rows[2]["Forward (s) mean"]) == 2.0 and float(rows[2]["Forward (s) std"]) == pytest.approx(1.0)
    # FSDP does not average: no aggregation time at all, rather than the instants between two steps
    assert rows[0]["Aggregation per step (s) mean"] == "" and rows[0]["FedAvg events"] == "0"
    assert any("FSDP and HSDP never average" in n for n in t.notes)
    assert rows[0]["Aggregation per FedAvg (s) mean"] == "" and rows[0]["Aggregation per FedAvg (s) std"] == ""
    assert float(rows[-1]["Aggregation per step (s) mean"]) == 0.3 / 8
    assert not any(c.startswith("Paper") for c in t.columns)


def test_latex_is_booktabs_and_escaped(tmp_path):
    tex = Table("t", ["a_b & c", "50% #1"], [["x_y", 1.5], ["–", None]]).to_latex()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"a\_b \& c & 50\% \#1 \\" in tex and r"x\_y & 1.5 \\" in tex and r"-- & -- \\" in tex
    t3 = table3(load_results(write_sweep(tmp_path, SWEEP))).to_latex()
    assert r"$\times$ faster than FSDP" in t3 and r"12.50 $\pm$ 6.35" in t3 and "12346" in t3 and "×" not in t3


def test_paper_columns_only_for_paper_layouts(tmp_path):
    p = LLAMA3_8B_PARAMS
    paper = [result("fsdp-8b", "fsdp", 1, 1, 512, None, 700.0, 480.0, world=512, params=p, floor=None),
             result("fl_hsdp-8b", "fl_hsdp", 16, 8, 4, 8, 100.0, 250.0, agg=0.1, world=512, params=p, floor=None),
             result("fl_hsdp-8b-A4", "fl_hsdp", 16, 8, 4, 4, 90.0, 260.0, agg=0.1, world=512, params=p, floor=None)]
    assert [reproduces_paper(vars(r)) for r in paper] == [True, True, False]
    assert reproduces_paper(dict(vars(paper[0]), A=3)) and not reproduces_paper(dict(vars(paper[0]), params=p - 1))
    t3 = table3(paper)
    assert column(t3, "A") == [None, 4, 8]
    assert column(t3, "Paper time (s)") == [770.54, None, 101.04]
    assert column(t3, "Paper eval PPL") == [486.64, None, 255.81] and "PPL floor" not in t3.columns
    assert column(t3, "× faster than FSDP") == [1.0, 700.0 / 90.0, 7.0]
    t4 = table4(paper)
    assert column(t4, "Paper aggregation per step (s)") == [None, None, (0.14, 0.54)]
    assert column(t4, "Paper backward (s)") == [7.50, None, None]
    assert "| 0.14 ± 0.54 |" in t4.to_markdown()
    assert "Paper time (s)" not in table3(SWEEP).columns


def test_write_report_files_and_plots(tmp_path):
    results = load_results(write_sweep(tmp_path, SWEEP))
    md, written = write_report(tmp_path, results, SimpleNamespace(executor="local"))
    assert "Table 3" in md and "Table 4" in md and f"- {LOCAL_NOTE}" in md
    assert sorted(p.name for p in written) == ["phases.png", "ppl_vs_time.png", "table3.csv", "table3.md",
                                               "table3.tex", "table4.csv", "table4.md", "table4.tex"]
    for name in ("table3", "table4"):
        for ext in ("md", "csv", "tex"):
            assert (tmp_path / f"{name}.{ext}").read_text()
    for png in ("ppl_vs_time.png", "phases.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_plots_without_metrics_or_floor(tmp_path):
    results = [result("fsdp-F1-R1-S4", "fsdp", 1, 1, 4, None, 100.0, 50.0, floor=None)]
    paths = plots(tmp_path, results)
    assert [p.name for p in paths] == ["ppl_vs_time.png", "phases.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_bad_json_and_empty_sweep(tmp_path):
    with pytest.raises(StateError, match="no results under"):
        write_report(tmp_path, load_results(tmp_path))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "result.json").write_text("{not json")
    with pytest.raises(StateError, match=r"broken[/\\]result\.json"):
        load_results(tmp_path)


def test_checkpoint_time_column_only_when_checkpoints_were_timed():
    assert "Checkpoint time (s)" not in table3(SWEEP).columns
    timed = [dataclasses.replace(SWEEP[-1], checkpoint_s=3.5)] + SWEEP[:-1]
    t = table3(timed)
    assert t.columns[t.columns.index("Training time (s)") + 1] == "Checkpoint time (s)"
    assert column(t, "Checkpoint time (s)")[0] == 3.5  # the FSDP row comes first


def test_predicted_column_from_the_plan_beside_grouped_repeats(tmp_path):
    results = load_results(write_sweep(tmp_path, SWEEP))
    assert "× less comm than FSDP (predicted)" not in table3(results).columns
    plan = {"runs": [{"run_id": r.run_id, "predicted_ratio_to_fsdp": 0.25 if r.strategy == "fl_fsdp" else None}
                     for r in SWEEP]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    write_report(tmp_path, results)
    rows = csv_rows(table3(results, {e["run_id"]: e["predicted_ratio_to_fsdp"] for e in plan["runs"]}))
    assert [r["× less comm than FSDP (predicted)"] for r in rows] == ["", "", "4.0", "4.0", ""]
    assert "× less comm than FSDP (predicted)" in (tmp_path / "table3.md").read_text()


def test_every_ratio_reads_one_way():
    from launcher.report.tables import oriented

    assert oriented(8.0, "slower") == "8.00×" and oriented(1 / 0.708, "slower") == "1.41×"
    assert oriented(0.708, "slower") == "1.41× slower" and oriented(0.5, "more", "less") == "2.00× more"
    assert oriented(4.0, "more", "less") == "4.00× less"
    t = table3([result("fsdp-F1-R1-S4", "fsdp", 1, 1, 4, None, 100.0, 50.0),
                result("fl_fsdp-F2-R1-S2-A4", "fl_fsdp", 2, 1, 2, 4, 141.0, 40.0, agg=0.2)])
    assert "| 1.41× slower | 1.25× |" in t.to_markdown()
    assert float(csv_rows(t)[1]["× faster than FSDP"]) == pytest.approx(100 / 141)  # CSV: the raw ratio


def test_differences_within_the_spread_of_repeats_are_marked_as_noise():
    runs = [result(f"fsdp-F1-R1-S4-rep{i}", "fsdp", 1, 1, 4, None, t, p) for i, (t, p) in
            enumerate([(100.0, 50.0), (104.0, 52.0)], 1)]
    runs += [result(f"fl_fsdp-F2-R1-S2-A4-rep{i}", "fl_fsdp", 2, 1, 2, 4, t, p, agg=0.2) for i, (t, p) in
             enumerate([(101.0, 30.0), (103.0, 31.0)], 1)]
    t = table3(runs)
    # paired by seed: time ratios 100/101 and 104/103 straddle 1 (noise); PPL ratios 50/30 and 52/31 do not
    assert column(t, "Within noise of FSDP") == ["", "time"]
    assert "95 % confidence half-width" in t.notes[0]
    ratio, low, high = column(t, "× faster than FSDP")[1]
    assert ratio == pytest.approx(((100 / 101) * (104 / 103)) ** 0.5) and low < 1 < high
    ratio, low, high = column(t, "× lower eval PPL than FSDP")[1]
    assert ratio == pytest.approx(((50 / 30) * (52 / 31)) ** 0.5) and 1 < low < ratio < high
    single = table3(SWEEP[-2:])
    assert "Within noise of FSDP" not in single.columns
    assert single.notes[0].startswith("One run per configuration: every number is a single sample")
    assert single.notes[0] in single.to_markdown() and f"% {single.notes[0]}" in single.to_latex()


def test_runs_drawn_on_top_of_each_other_stay_distinguishable():
    from launcher.report.plots import line_style

    styles = [(s["linestyle"], s["marker"]) for s in map(line_style, range(12))]
    assert len(set(styles)) == 12


def test_an_empty_sweep_points_at_a_sweep_in_the_old_layout(tmp_path):
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "manifest.jsonl").write_text("")
    sweep_dir = tmp_path / "local" / "smoke"
    with pytest.raises(StateError, match=f"{tmp_path / 'smoke'} holds a sweep from before directories were keyed "
                                         f"by cluster: move it to {sweep_dir}"):
        write_report(sweep_dir, [])


def entry(run_id: str, step: float) -> dict:
    """A plan.json run entry predicting `step` seconds, half of it the shard group's traffic."""
    return {"run_id": run_id, "predicted_ratio_to_fsdp": None, "predicted_step_s": step,
            "predicted_step_bounds_s": [step / 2, step], "predicted_compute_s": 0.1, "compute_source": "measured",
            "predicted_comm_by_group_s": {"shard": step / 2, "replicate": 0.0, "federation": 0.0},
            "model": {"preset": "tiny"}}


def test_predicted_step_beside_measured_with_error_order_and_plot(tmp_path):
    from launcher.report.prediction import order_note, prediction_table
    from tests.support import make_result

    start = "2026-12-01T10:00:00+00:00"
    results = [make_result(run_id="fsdp-F1-R1-S4", train_time_s=8.0, steps=8, started_at=start),  # 1.0 s/step
               make_result(run_id="fl_fsdp-F2-R1-S2-A4", strategy="fl_fsdp", F=2, S=2, A=4, train_time_s=4.0,
                           started_at=start),
               make_result(run_id="hsdp-F1-R2-S2", strategy="hsdp", R=2, S=2, train_time_s=6.0, started_at=start)]

    def registered(run_id, step, at="2026-12-01T09:59:00+00:00"):
        return {**entry(run_id, step), "model": "tiny", "placement": "topology", "predicted_at": at}

    plan = {"network": "probe x", "runs": [entry("fsdp-F1-R1-S4", 5.0), entry("fl_fsdp-F2-R1-S2-A4", 5.0),
                                           entry("hsdp-F1-R2-S2", 0.9)]}
    # fsdp and fl_fsdp registered before they started; plan.json's later values are not used for them. hsdp's
    # registration came after its start: post hoc, shown from plan.json, counted nowhere
    reg = {"fsdp-F1-R1-S4": registered("fsdp-F1-R1-S4", 1.1),
           "fl_fsdp-F2-R1-S2-A4": registered("fl_fsdp-F2-R1-S2-A4", 0.4),
           "hsdp-F1-R2-S2": registered("hsdp-F1-R2-S2", 0.75, at="2026-12-01T10:00:01+00:00")}
    table = prediction_table(results, plan, reg, "topology")
    assert table.columns[:11] == ["run_id", "strategy", "placement", "model", "seq_len", "predicted_step_s",
                                  "measured_step_s", "measured_ci_s", "error", "predicted_at", "started_at"]
    assert table.to_csv().startswith("run_id,strategy,placement,model,seq_len,predicted_step_s,")
    assert "| Run | Strategy | Placement | Model | Seq len | Predicted step (s) | Measured step (s) |" \
        in table.to_markdown()
    rows = {r[0]: r for r in table.rows}
    assert rows["fsdp-F1-R1-S4"][1:12] == ["fsdp", "topology", "tiny", 16, 1.1, 1.0, None, pytest.approx(0.1),
                                           "2026-12-01T09:59:00+00:00", start, "registered"]
    assert rows["fl_fsdp-F2-R1-S2-A4"][8] == pytest.approx(-0.2)  # 0.4 predicted, 0.5 measured
    assert rows["hsdp-F1-R2-S2"][5] == 0.9 and rows["hsdp-F1-R2-S2"][11] == "post hoc"
    assert table.notes[0] == ("Post hoc: hsdp-F1-R2-S2 had no prediction registered before their runs started; "
                              "they are shown, not counted in any accuracy figure.")
    assert table.notes[1].startswith("2 of 2 registered predictions within ±20%; largest error -20.0%")
    assert "the 2 configurations sorted by predicted step time are in their measured order" in table.notes[2]
    assert "probe x" in table.notes[3]
    assert "| -20.0% |" in table.to_markdown()
    unregistered = prediction_table(results, plan)  # no registration at all: every row post hoc, no accuracy
    assert {r[11] for r in unregistered.rows} == {"post hoc"}
    assert unregistered.notes[1] == "No prediction was registered before its runs started: no accuracy is claimed."
    # repeats are one row: mean and 95 % interval; registered only if every repeat's registration predates it
    reps = [make_result(run_id=f"hsdp-F1-R2-S2-rep{i}", strategy="hsdp", R=2, S=2, train_time_s=t, started_at=start)
            for i, t in ((1, 5.0), (2, 7.0))]
    reg_reps = {f"hsdp-F1-R2-S2-rep{i}": registered(f"hsdp-F1-R2-S2-rep{i}", 0.9) for i in (1, 2)}
    [row] = prediction_table(reps, plan, reg_reps).rows
    assert row[5:9] == [0.9, 0.75, pytest.approx(12.7062 * 2 ** 0.5 / 2 ** 0.5 / 8, rel=1e-4), pytest.approx(0.2)]
    assert row[11:13] == ["registered", 2]
    notes = prediction_table(reps, plan, reg_reps).notes
    assert notes[-2] == "network: probe x; compute: measured."
    # what the interval spans: this sweep's repeats, when they started, and not another day or machine
    assert notes[-1].startswith("Measured step: mean ± 95 % half-width over the repeats. Intervals span the repeats "
                                "(seeds) of this one sweep, started ")
    assert "not another day's or another machine's" in notes[-1]
    assert "mean |error| 20.0%" in notes[0]
    del reg_reps["hsdp-F1-R2-S2-rep2"]
    assert prediction_table(reps, {"runs": [{**entry("hsdp-F1-R2-S2-rep1", 0.9)}]}, reg_reps).rows[0][11] == "post hoc"
    note = order_note([("a", 1.0, 2.0, 0.1), ("b", 2.0, 1.0, 0.1), ("c", 3.0, 3.0, 0.1), ("d", 3.5, 2.95, 0.1)])
    assert note.startswith("Order: 2 of 6 pairs are predicted in the other order than measured, 1 of them within")
    assert "c / d (within noise)" in note and "a / b," in note
    # written by the report from plan.json and each run's prediction.json
    for r in results:
        (tmp_path / r.run_id).mkdir()
        r.save(tmp_path / r.run_id / "result.json")
        (tmp_path / r.run_id / "prediction.json").write_text(json.dumps(reg[r.run_id]))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    _, written = write_report(tmp_path, results)
    assert {"prediction.csv", "prediction.md", "prediction.png"} <= {p.name for p in written}
    header = (tmp_path / "prediction.csv").read_text().splitlines()[0]
    assert header.startswith("run_id,strategy,placement,model,seq_len,predicted_step_s,measured_step_s,measured_ci_s,"
                             "error,predicted_at,started_at")
    assert (tmp_path / "prediction.png").read_bytes()[:8] == PNG
    assert prediction_table(results, {"runs": [{"run_id": "fsdp-F1-R1-S4", "predicted_ratio_to_fsdp": 1.0}]}) is None
    # compute unknown (cluster=local without a probe): communication only, so no step-time prediction is shown
    blind = {"runs": [{**entry("fsdp-F1-R1-S4", 0.01), "compute_source": "unknown: no probe and no peak_flops"}]}
    assert prediction_table(results, blind) is None


def test_pareto_front_keeps_runs_nothing_beats_on_speed_and_quality():
    from launcher.report.plots import pareto_front

    points = [(100.0, 6.0, "fsdp"), (150.0, 6.2, "fl A=4"), (140.0, 6.3, "fl A=2"), (200.0, 6.5, "fl A=64"),
              (200.0, 6.4, "fl A=8"), (90.0, 6.0, "hsdp")]
    assert [p[2] for p in pareto_front(points)] == ["fl A=8", "fl A=4", "fsdp"]


def test_time_to_target_columns_and_eval_plot(tmp_path):
    from launcher.report.plots import plots as draw
    from tests.support import make_result

    history = [[4, 2.0, 300.0], [8, 4.0, 90.0]]
    results = [make_result(target_ppl=100.0, time_to_target_s=10.0, steps_to_target=8, eval_history=history),
               make_result(run_id="fl_fsdp-F2-R1-S2-A4", strategy="fl_fsdp", F=2, S=2, A=4, target_ppl=100.0,
                           time_to_target_s=4.0, steps_to_target=8, eval_history=history),
               make_result(run_id="hsdp-F1-R2-S2", strategy="hsdp", R=2, S=2, target_ppl=100.0)]  # never reached
    rows = {r["Strategy"]: r for r in csv_rows(table3(results))}
    assert rows["FL+FSDP"]["Time to target (s)"] == "4.0" and rows["FL+FSDP"]["× faster to target than FSDP"] == "2.5"
    assert rows["HSDP"]["Time to target (s)"] == "" and rows["HSDP"]["× faster to target than FSDP"] == ""
    assert "Time to target (s)" not in table3([make_result()]).columns
    written = draw(tmp_path, results)
    assert (tmp_path / "eval_vs_time.png") in written and (tmp_path / "eval_vs_time.png").read_bytes()[:8] == PNG
    assert (tmp_path / "speed_vs_quality.png").read_bytes()[:8] == PNG
    # repeats: one that never reached the target makes the configuration's time null, not the other's time
    reps = [make_result(run_id=f"fsdp-F1-R1-S4-rep{i}", target_ppl=100.0, time_to_target_s=t)
            for i, t in ((1, 5.0), (2, None))]
    assert group_repeats(reps)[0]["time_to_target_s"] is None


def test_runs_that_have_not_learned_get_no_quality_ratio():
    """eval PPL at or above the unigram baseline: marked, and no "× lower eval PPL" printed for the run or
    against a reference that has not learned either."""
    learned = [result("fsdp-F1-R1-S4", "fsdp", 1, 1, 4, None, 100.0, 50.0, baseline_ppl=120.0),
               result("hsdp-F1-R2-S2", "hsdp", 1, 2, 2, None, 40.0, 130.0, baseline_ppl=120.0),
               result("fl_fsdp-F2-R1-S2-A4", "fl_fsdp", 2, 1, 2, 4, 30.0, 40.0, agg=0.2, baseline_ppl=120.0)]
    t = table3(learned)
    assert column(t, "Learned") == ["yes", "not learned", "yes"]
    assert column(t, "× lower eval PPL than FSDP") == [1.0, None, 1.25]
    assert column(t, "× faster than FSDP") == [1.0, 2.5, 100 / 30]  # speed is still compared
    assert any("has not learned" in note for note in t.notes)
    unlearned_reference = [dataclasses.replace(learned[0], eval_ppl=121.0), learned[2]]
    assert column(table3(unlearned_reference), "× lower eval PPL than FSDP") == [None, None]
    assert "Learned" not in table3(SWEEP).columns  # results without a baseline: no column


def test_floor_is_a_line_near_the_curves_and_a_note_far_below_them():
    import matplotlib.pyplot as plt

    from launcher.report.plots import floor_line
    from tests.support import make_result

    runs = [make_result(floor_ppl=5.53), make_result(floor_ppl=5.62)]
    for curve, drawn in (([500.0, 480.0], False), ([9.0, 6.1], True)):
        fig, ax = plt.subplots()
        ax.plot([0, 1], curve)
        floor_line(ax, runs)
        labels = [line.get_label() for line in ax.lines]
        notes = [t.get_text() for t in ax.texts]
        assert ("floor 5.53–5.62" in labels) == drawn  # one line for all seeds' floors, their range in its label
        assert (notes == ["floor 5.53–5.62: far below these curves"]) == (not drawn)
        plt.close(fig)


def test_a_table_refuses_kinds_or_rows_that_do_not_match_its_columns():
    """Markdown and LaTeX zip cells with kinds: a short list would drop the last columns without a word."""
    from launcher.report.tables import Table

    with pytest.raises(ValueError, match="4 kinds for 5 columns"):
        Table("t", list("abcde"), [[1, 2, 3, 4, 5]], ["text", "fixed", "fixed", "text"])
    with pytest.raises(ValueError, match="a row of 4 cells for 5 columns"):
        Table("t", list("abcde"), [[1, 2, 3, 4]])


def test_equal_ratios_read_as_equal_and_the_front_ties_equal_perplexities():
    from launcher.report.plots import pareto_front
    from launcher.report.tables import oriented

    assert oriented(0.999, "higher") == "1.00×" and oriented(1.0004, "slower", "faster") == "1.00×"
    assert oriented(0.98, "higher") == "1.02× higher" and oriented(1.5, "slower", "faster") == "1.50× faster"
    # HSDP faster, its perplexity 0.1 % above FSDP's: FSDP is not on the front; a clearly better slow one is
    front = pareto_front([(100.0, 20.00, "fsdp"), (150.0, 20.02, "hsdp"), (50.0, 15.0, "slow")])
    assert [p[2] for p in front] == ["hsdp", "slow"]


def test_the_prediction_compares_the_steady_step_where_the_runs_recorded_it():
    """Issue 54, item 4: the model predicts a steady-state step; train_time_s / steps carries the first steps'
    communicator set-up. A configuration whose every repeat recorded steady_step_s is compared with its mean (and
    interval), one that did not (a result from before) with train_time_s / steps, and the table says which."""
    from launcher.report.prediction import prediction_table
    from tests.support import make_result

    start = "2026-12-01T10:00:00+00:00"
    results = [make_result(run_id=f"fsdp-F1-R1-S4-rep{i}", config="fsdp-F1-R1-S4", repeat=i, train_time_s=8.0,
                           started_at=start, steady_step_s=step, steady_steps=6) for i, step in ((1, 0.7), (2, 0.9))]
    results.append(make_result(run_id="hsdp-F1-R2-S2", strategy="hsdp", R=2, S=2, train_time_s=6.0, started_at=start))

    plan = {"network": "probe x", "runs": [entry("fsdp-F1-R1-S4-rep1", 0.88), entry("hsdp-F1-R2-S2", 0.6)]}
    table = prediction_table(results, plan)
    rows = {r[0]: r for r in table.rows}
    assert table.columns[-1] == "measured_as" and "steady_step_s" in table.title
    fsdp, hsdp = rows["fsdp-F1-R1-S4"], rows["hsdp-F1-R2-S2"]
    assert fsdp[6] == pytest.approx(0.8) and fsdp[8] == pytest.approx(0.1) and fsdp[-1] == "steady_step_s"
    assert fsdp[7] == pytest.approx(12.7062 * (0.02 ** 0.5) / 2 ** 0.5, rel=1e-4)  # t(1) x sd / sqrt(2)
    assert hsdp[6] == pytest.approx(0.75) and hsdp[-1] == "train_time_s / steps"  # 6 s / 8 steps: no steady step
    assert table.notes[-1].startswith("Measured step: steady_step_s (the steps after the second")
    assert "train_time_s / steps for hsdp-F1-R2-S2" in table.notes[-1]
    old = prediction_table([r for r in results if r.steady_step_s is None], plan)  # no run recorded it: as before
    assert "measured_as" not in old.columns and old.title.endswith("(train_time_s / steps)")


def test_a_model_parallel_runs_steady_step_keeps_both_its_measurement_and_its_degrees():
    """A run at tp = 2 that recorded steady_step_s: the table has the "Measured as" column and the P and T columns,
    each row a cell for each (action=validate with sweep.tp=[1,2] stopped on a row one cell longer than its
    columns)."""
    from launcher.report.prediction import prediction_table
    from tests.support import make_result

    start = "2026-12-01T10:00:00+00:00"
    results = [make_result(run_id="fsdp-F1-R1-S4", train_time_s=8.0, started_at=start, steady_step_s=0.9,
                           steady_steps=6),
               make_result(run_id="fsdp-F1-R1-S2-T2", S=2, tp=2, train_time_s=6.0, started_at=start,
                           steady_step_s=0.7, steady_steps=6)]
    plan = {"network": "probe x", "runs": [entry(r.run_id, 1.0) for r in results]}
    table = prediction_table(results, plan)
    assert table.columns[-3:] == ["measured_as", "pp", "tp"]
    assert {row[0]: row[-3:] for row in table.rows} == {"fsdp-F1-R1-S4": ["steady_step_s", 1, 1],
                                                         "fsdp-F1-R1-S2-T2": ["steady_step_s", 1, 2]}
    assert "| Measured as | P | T |" in table.to_markdown()


def test_the_rule_fixed_before_the_runs_judges_each_clause():
    """Issue 54's rule: ±20 % or 2 x the interval, mean |error| <= 10 %, the fastest predicted fastest, no pair
    ordered against the measurement beyond both intervals."""
    from launcher.report.prediction_parts import rule

    good = [("a", 1.05, 1.0, 0.01), ("b", 1.9, 2.0, 0.02), ("c", 3.1, 3.0, 0.05)]
    passes, clauses = rule(good)
    assert passes and all(c.startswith("pass: ") for c in clauses)
    # 30 % off but inside twice a wide interval: still within; its 30 % error still counts in the mean
    noisy = [("a", 1.0, 1.0, 0.0), ("b", 2.6, 2.0, 0.35)]
    passes, clauses = rule(noisy)
    assert clauses[0].startswith("pass: ") and clauses[1].startswith("MISS: mean |error| 15.0%") and not passes
    # the fastest measured is predicted second; the swap is beyond both intervals
    swapped = [("a", 1.2, 1.0, 0.01), ("b", 1.1, 1.15, 0.01)]
    passes, clauses = rule(swapped)
    assert not passes and clauses[2] == "MISS: fastest measured a, predicted b"
    assert clauses[3] == "MISS: pairs ordered against the measurement beyond both intervals: 1 (a / b)"
    # the same swap within the measured intervals is noise
    assert rule([("a", 1.2, 1.0, 0.1), ("b", 1.1, 1.15, 0.1)])[1][3].startswith("pass: ")
    assert rule([]) == (False, ["no registered prediction"])


def test_each_part_of_the_step_is_set_against_its_measurement():
    from launcher.report.prediction_parts import parts_table

    runs = {"x": SimpleNamespace(compute_only_s=1.0, exposed_comm_s=0.5, first_step_s=3.0),
            "x-rep2": SimpleNamespace(compute_only_s=1.2, exposed_comm_s=0.3, first_step_s=None)}
    registered = {run: {"predicted_compute_s": 1.21, "predicted_first_step_s": 2.0,
                        "predicted_exposed_comm_s": {"shard": 0.2, "federation": 0.1, "by_level": {"leaf": 0.3}}}
                  for run in runs}
    table = parts_table([{"run_id": "x", "runs": list(runs)}], runs, registered)
    [row] = table.rows
    assert row[0] == "x" and row[1:4] == [1.21, pytest.approx(1.1), pytest.approx(0.1)]
    assert row[4:7] == [pytest.approx(0.3), pytest.approx(0.4), pytest.approx(-0.25)]
    assert row[7:10] == [2.0, 3.0, pytest.approx(-1 / 3)]
    # registries from before the schedule have no parts: no table
    assert parts_table([{"run_id": "x", "runs": ["x"]}], runs, {"x": {"predicted_compute_s": 1.0}}) is None
