"""Committed results are the launcher's own sweep directories, with every run's result.json and metrics.jsonl:
`action=report` on a copy rebuilds each committed table byte for byte with the current code (the launcher forked
from a preloaded interpreter, tests/forked.py)."""
import csv
import json
import re
import shutil

import pytest

from launcher.actions import dryrun
from tests import forked
from tests.study_data import RESULTS, table3
from tests.support import ROOT, clean_env

# each committed sweep directory (under results/: <cluster>/<sweep>, or deeper inside a study's folder, as
# results_dir=results/testbed/fault_tolerance/<path> puts it), named by the command that made it: its command.txt
COMMITTED = sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.rglob("manifest.jsonl"))
REBUILT = ("table3.csv", "table4.csv", "prediction.csv", "placement.csv", "scaling.csv")


def test_every_committed_sweep_records_the_command_that_made_it():
    for where in COMMITTED:
        [line] = (RESULTS / where / "command.txt").read_text().splitlines()
        name = where.split("/")[-1]
        assert line.startswith("python -m launcher "), where
        assert f"sweep.name={name}" in line.split() or f"sweep={name}" in line.split(), where


@pytest.mark.parametrize("where", sorted(COMMITTED))
@pytest.mark.slow
def test_report_rebuilds_the_committed_tables(where, tmp_path):
    committed = RESULTS / where
    runs = [p.parent for p in committed.glob("*/spec.json")]
    assert runs and all((r / "result.json").exists() and (r / "metrics.jsonl").exists() for r in runs)
    shutil.copytree(committed, tmp_path / where)
    for name in REBUILT:
        (tmp_path / where / name).unlink(missing_ok=True)
    proc = forked.run("launcher", "action=report", f"results_dir={tmp_path / where}", cwd=ROOT,  # its record alone
                      env=clean_env(slurm_client=False), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for name in REBUILT:
        if (committed / name).exists():
            assert (tmp_path / where / name).read_bytes() == (committed / name).read_bytes(), name
    header = next(csv.reader((committed / "table3.csv").read_text().splitlines()))
    assert "n" in header  # repeats are counted in every committed table


def _runs(where: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((RESULTS / where).glob("*/result.json"))]


def test_testbed_readme_quotes_testbed_table3_as_its_data_gives_it():
    readme = (RESULTS / "testbed" / "README.md").read_text()
    for row in table3("testbed/testbed_table3"):
        assert f"{float(row['Training time (s) mean']):.2f} ± {float(row['Training time (s) ci95']):.2f}" in readme
        assert f"| {float(row['× less comm than FSDP (predicted)']):#.3g}×" in readme
        if row["Strategy"] != "FSDP":
            low, high = float(row["× faster than FSDP low"]), float(row["× faster than FSDP high"])
            assert f"{float(row['× faster than FSDP']):.2f}× ({low:.2f}–{high:.2f})" in readme
            assert low > 1  # "faster than FSDP": the interval excludes 1
        assert row["Learned"] == "not learned" and row["n"] == "3"
    runs = _runs("testbed/testbed_table3")
    evals, baselines = [r["eval_ppl"] for r in runs], [r["baseline_ppl"] for r in runs]
    assert all(r["eval_ppl"] > r["baseline_ppl"] for r in runs)
    assert f"({min(evals):.2f}–{max(evals):.2f};" in readme and f"({min(baselines):.2f}–{max(baselines):.2f})" in readme


def test_the_testbed_table3_rerun_is_quoted_and_judged_as_its_data_give_it():
    """Issue 41, item 6: the rerun's speed-ups, inside or not the committed intervals, and the speed-ups and
    compute/communication split its registered predictions gave, all from its own files."""
    readme = (RESULTS / "testbed" / "README.md").read_text()
    committed = {r["Strategy"]: r for r in table3("testbed/testbed_table3")}
    predicted = {r["strategy"]: r for r in csv.DictReader(
        (RESULTS / "testbed/testbed_table3_rerun/prediction.csv").read_text().splitlines())}
    assert all(r["basis"] == "registered" for r in predicted.values())
    fsdp_step = float(predicted["fsdp"]["predicted_step_s"])
    names = {"FSDP": "fsdp", "HSDP": "hsdp", "FL+FSDP": "fl_fsdp", "FL+HSDP": "fl_hsdp"}
    for row in table3("testbed/testbed_table3_rerun"):
        p = predicted[names[row["Strategy"]]]
        comm = sum(float(p[f"predicted_{g}_comm_s"]) for g in ("shard", "replicate", "federation"))
        cells = (f"| {float(row['Training time (s) mean']):.2f} ± {float(row['Training time (s) ci95']):.2f} |",
                 f"| {fsdp_step / float(p['predicted_step_s']):.2f}× | {float(p['predicted_compute_s']):.3f} + "
                 f"{comm:.3f} | {float(p['measured_step_s']):.3f} ± {float(p['measured_ci_s']):.3f} |")
        assert all(c in readme for c in cells), cells
        if row["Strategy"] == "FSDP":
            continue
        ratio, low, high = (float(row[f"× faster than FSDP{k}"]) for k in ("", " low", " high"))
        before = committed[row["Strategy"]]
        inside = float(before["× faster than FSDP low"]) <= ratio <= float(before["× faster than FSDP high"])
        assert (f"{ratio:.2f}× ({low:.2f}–{high:.2f}) | {float(before['× faster than FSDP low']):.2f}–"
                f"{float(before['× faster than FSDP high']):.2f} | {'yes' if inside else '**no**'}") in readme


@pytest.mark.parametrize("where", ["testbed/validation_model_parallel_mha",
                                   "testbed/validation_model_parallel_inplace"])
def test_the_from_parts_columns_are_the_committed_post_hoc_plans(where):
    """Issue 41, item 4: the "from parts, post hoc" column is from_parts/plan.json (the sweep's own probe without
    its in-place stage steps) against the measured steps; the probe it used is the committed one less `layouts`."""
    probe = json.loads((RESULTS / where / "probe.json").read_text())
    parts = json.loads((RESULTS / where / "from_parts/probe.json").read_text())
    assert "layouts" not in parts and parts == {k: v for k, v in probe.items() if k != "layouts"}
    command = (RESULTS / where / "from_parts/command.txt").read_text()
    assert f"cluster.probe=results/{where}/from_parts/probe.json" in command and "action=plan" in command
    plan = {e["run_id"]: e for e in json.loads((RESULTS / where / "from_parts/plan.json").read_text())["runs"]}
    assert not any(e["compute_source"].startswith("the layout's stage") for e in plan.values())
    section = (RESULTS / "testbed" / "README.md").read_text().split(f"(`{where.split('/')[1]}/`)", 1)[1]
    for r in csv.DictReader((RESULTS / where / "prediction.csv").read_text().splitlines()):
        error = plan[r["run_id"]]["predicted_step_s"] / float(r["measured_step_s"]) - 1
        row = f"| {float(r['predicted_step_s']):.3f} | {float(r['measured_step_s']):.3f} ± "
        line = next(line for line in section.splitlines() if row in line)
        assert line.endswith(f"| {_signed(error)} |"), (line, _signed(error))


def _signed(x: float) -> str:
    return f"{x * 100:+.1f} %".replace("-", "−")


VALIDATIONS = ["testbed/validation_slurm_mini", "testbed/validation_slurm_mini_seq128", "testbed/validation_slurm_tiny",
               "testbed/validation_topology_mini", "testbed/validation_topology_tiny",
               "testbed/validation_model_parallel", "testbed/validation_model_parallel_mha",
               "testbed/validation_model_parallel_inplace", "testbed/validation_inplace_topology_tiny",
               "testbed/validation_inplace_topology_mini", "testbed/validation_inplace_slurm_tiny",
               "testbed/validation_inplace_model_parallel_tiny"]


@pytest.mark.parametrize("where", VALIDATIONS)
def test_testbed_readme_quotes_each_validation_as_its_data_gives_it(where):
    """Every row of a validation's prediction.csv (itself rebuilt from the runs above) is in the README's table,
    and the verdict's counts and worst error are the data's."""
    readme = (RESULTS / "testbed" / "README.md").read_text()
    rows = list(csv.DictReader((RESULTS / where / "prediction.csv").read_text().splitlines()))
    assert rows and all(r["basis"] == "registered" and r["n"] == "3" for r in rows)
    for r in rows:
        cells = (f"| {float(r['predicted_step_s']):.3f} | {float(r['measured_step_s']):.3f} ± "
                 f"{float(r['measured_ci_s']):.3f} | {_signed(float(r['error']))} |")
        assert cells in readme, cells
    within = sum(abs(float(r["error"])) <= 0.20 for r in rows)
    worst = max(rows, key=lambda r: abs(float(r["error"])))
    assert f"{within} of {len(rows)} are within ±20 %" in readme
    assert f"{_signed(float(worst['error']))}." in readme
    if "inplace_" in where:  # issue 41's conditions also judge the mean |error|
        mean = sum(abs(float(r["error"])) for r in rows) / len(rows)
        assert f"{within} of {len(rows)} are within ±20 %, mean |error| {100 * mean:.1f} %" in readme


@pytest.mark.parametrize("where", [w for w in sorted(COMMITTED) if (RESULTS / w / "README.md").exists()])
def test_a_sweep_readme_gives_the_command_that_rebuilds_it(where):
    """Each study sweep's README says how it was made (command, commit, machine, date), what its intervals span
    (issue 41: seeds of one session on one machine) and how to rebuild it."""
    readme = (RESULTS / where / "README.md").read_text()
    assert f"`python -m launcher action=report results_dir=results/{where}`" in readme
    assert re.search(r"^    (slurm/testbed/lab )?python -m launcher .*sweep=", readme, re.M)  # the command that ran
    for line in ("- Commit: ", "- Machine: ", "- Date: 2026-", "- Intervals: ", "- What it shows: "):
        assert line in readme, line


def test_each_sweep_run_from_a_dirty_tree_is_said_to_be_so_where_it_is_described():
    """Issue 41, item 4: a sweep whose runs record a dirty commit (prediction.json) is described by a README under
    results/ that names that commit as dirty and says what was uncommitted."""
    readmes = {p: p.read_text() for p in RESULTS.rglob("README.md")}
    dirty = {}
    for path in RESULTS.glob("*/*/*/prediction.json"):
        commit = json.loads(path.read_text()).get("commit", "")
        if commit.endswith("-dirty"):
            dirty.setdefault(str(path.parent.parent.relative_to(RESULTS)), set()).add(commit[:7] + "-dirty")
    assert len(dirty) >= 5  # precision_fp32, precision_paper, two validations, testbed_table3
    for where, commits in dirty.items():
        describing = [text for text in readmes.values() if where.split("/")[1] + "/" in text]
        assert describing, f"no README describes {where}"
        for commit in commits:
            assert any(f"`{commit}`" in text for text in describing), f"{where}: no README names {commit}"


def test_every_committed_sweep_has_a_readme():
    """A sweep has a README of its own, or its cluster folder's README (results/testbed/, a testbed shape's) names
    its folder (`name/`) where it describes it, or heads a section with it."""
    def named(where: str) -> bool:  # by the README of a folder above it, naming the first folder below that one
        parts = where.split("/")
        for depth in range(1, len(parts)):
            readme, name = RESULTS.joinpath(*parts[:depth]) / "README.md", parts[depth]
            if readme.exists() and any(f in readme.read_text() for f in (f"`{name}/`", f"## {name}:")):
                return True
        return False
    assert [w for w in COMMITTED if not (RESULTS / w / "README.md").exists() and not named(w)] == []


@pytest.mark.parametrize("where", ["testbed/validation_model_parallel", "testbed/scaling_weak"])
def test_model_parallel_degrees_are_columns_of_table3_and_prediction(where):
    """The pipeline and tensor-parallel degrees are numbers in the CSVs, equal to each configuration's result.json,
    not only text inside the run ids."""
    configs = {re.sub(r"-rep\d+$", "", r["run_id"]): (r["pp"], r["tp"]) for r in _runs(where)}
    assert any(pp * tp > 1 for pp, tp in configs.values())
    prediction = list(csv.DictReader((RESULTS / where / "prediction.csv").read_text().splitlines()))
    assert prediction and all((int(row["pp"]), int(row["tp"])) == configs[row["run_id"]] for row in prediction)
    table = list(csv.DictReader((RESULTS / where / "table3.csv").read_text().splitlines()))
    assert sorted((int(row["P"]), int(row["T"])) for row in table) == sorted(configs.values())


@pytest.mark.parametrize("cluster", ["leonardo", "nvl72"])
def test_action_plan_rebuilds_the_committed_rankings(cluster, tmp_path):
    """results/plans/: each ranking.md and plan.json is what action=plan writes today with the README's command,
    less its dry-run (5 min per cluster; the dry-run itself is checked against real ranks in test_dryrun): the
    ranking byte for byte, plan.json but for the measured fields, which recompute from the committed dryrun.json.
    No machine path takes part: the interpreter the sbatch scripts name (the committing machine's in the committed
    plan, another venv's here: cluster.python) and the folder they were written in are left out of the comparison
    (issue 57: the test failed in any venv but the development machine's)."""
    readme = (RESULTS / "plans" / "README.md").read_text()
    [command] = [line.split("python -m launcher ")[1] for line in readme.splitlines()
                 if "python -m launcher " in line and f"cluster={cluster} " in line]
    args = [a for a in command.split() if not a.startswith(("results_dir=", "plan.dryrun="))]
    assert len(args) == len(command.split()) - 2, "the README's command writes results_dir and runs the dry-run"
    proc = forked.run("launcher", *args, f"results_dir={tmp_path}", f"cluster.python={tmp_path}/venv/bin/python",
                      cwd=ROOT, env=clean_env(slurm_client=False), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    committed = RESULTS / "plans" / cluster / "paper_table3"
    rebuilt = tmp_path / cluster / "paper_table3"
    assert (rebuilt / "ranking.md").read_text() == (committed / "ranking.md").read_text()
    def plan_of(folder):  # the sbatch scripts name the interpreter and the folder they were written in
        text = re.sub(r"[^\s\"]+(?= -u -m submitit\.core\._submit )", "<python>", (folder / "plan.json").read_text())
        return json.loads(re.sub(rf"/[^\s\"]*/(?={cluster}/paper_table3/)", "<results_dir>/", text))

    plan, again = plan_of(committed), plan_of(rebuilt)
    measured = json.loads((committed / "dryrun.json").read_text())
    runs = {run["run_id"]: run for run in again.pop("runs")}
    assert {k: v for k, v in plan.items() if k != "runs"} == again
    for run in plan["runs"]:
        memory = run.pop("memory")
        reports = measured[measured[run["run_id"]]["played_as"]]["ranks"]
        assert (memory["dryrun_peak_bytes"], memory["dryrun_after_training_bytes"]) == dryrun.memory_of(reports)
        expected = runs[run["run_id"]].pop("memory")
        assert memory == expected | {k: memory[k] for k in ("dryrun_peak_bytes", "dryrun_after_training_bytes")}
        assert run == runs[run["run_id"]]


def test_the_plans_readme_faces_the_paper_with_numbers_from_plan_json():
    """results/plans/README.md's table against the paper, recomputed here from the committed plan.json and the
    paper's Table 3 (launcher.report.paper.TABLES), without the report code: every cell as printed."""
    from launcher.report.paper import TABLES

    readme = (RESULTS / "plans" / "README.md").read_text()
    block = readme.split("<!-- against-paper -->")[1].split("<!-- /against-paper -->")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]
    plan = json.loads((RESULTS / "plans" / "leonardo" / "paper_table3" / "plan.json").read_text())
    labels = {"fsdp": "FSDP", "hsdp": "HSDP", "fl_fsdp": "FL+FSDP", "fl_hsdp": "FL+HSDP"}
    paper_order = sorted(TABLES, key=lambda s: TABLES[s]["train_time_s"])
    ranking = [(r["strategy"], r["F"], r["R"], r["S"], r["A"], r["pp"], r["tp"]) for r in plan["ranking"]]
    fsdp_step = next(r["predicted_step_s"] for r in plan["runs"] if r["strategy"] == "fsdp")
    expected = []
    for run in plan["runs"]:
        s = run["strategy"]
        predicted = run["train"]["steps"] * run["predicted_step_s"]
        paper = TABLES[s]["train_time_s"]
        expected.append([labels[s], f"({run['F']},{run['R']},{run['S']})", str(run["A"] or "–"), f"{paper:.2f}",
                         str(paper_order.index(s) + 1), f"{predicted:.1f}", f"{predicted / paper:.3f}",
                         str(ranking.index((s, run["F"], run["R"], run["S"], run["A"], 1, 1)) + 1),
                         f"{fsdp_step / run['predicted_step_s']:.2f}", f"{TABLES['fsdp']['train_time_s'] / paper:.2f}"])
    assert rows == expected
    assert f"among the {len(ranking)} of plan.json" in readme and len(ranking) == 468


@pytest.mark.parametrize("sweep,kind", [("scaling_weak", "weak"), ("scaling_strong", "strong")])
def test_the_front_pages_step_time_bullet_includes_the_scaling_sweeps(sweep, kind):
    """README.md's step-time bullet quotes each scaling sweep's registered predictions as its prediction.csv gives
    them: how many within ±20 %, the worst error and the mean |error|."""
    rows = list(csv.DictReader((RESULTS / "testbed" / sweep / "prediction.csv").read_text().splitlines()))
    assert rows and {row["basis"] for row in rows} == {"registered"}
    errors = [float(row["error"]) for row in rows]
    worst = max(errors, key=abs)
    mean = sum(map(abs, errors)) / len(errors)
    quoted = (f"{kind} scaling {sum(abs(e) <= 0.2 for e in errors)} of {len(rows)} within ±20 % (worst "
              f"{worst * 100:+.1f} %, mean |error| {mean * 100:.1f} %)")
    assert quoted in " ".join((RESULTS / "README.md").read_text().split())


STUDY = RESULTS / "testbed" / "fault_tolerance"
STUDY_COMMANDS = {  # folder: the commands its README gives (the rule's section, committed before the runs)
    "": {"kill": "--cluster testbed --kind kill --nodes 4 --steps 640 --fault-step 240 --checkpoint-every 64 "
                 "--repair-s 5",
         "slow": "--cluster testbed --kind slow --nodes 4 --steps 160 --fault-step 60 --speed 0.5 --grace 0.2"},
    "long": {"kill": "--cluster testbed --kind kill --nodes 4 --steps 1920 --fault-step 240 --checkpoint-every 64 "
                     "--repair-s 5"},
    "pairs": {"pairs": "--cluster testbed --kind pairs --seeds 45 46 47 48 49 50 --nodes 4 --steps 1920 "
                       "--fault-step 240 --repair-s 5"}}


@pytest.mark.parametrize("folder,kind", [(f, k) for f, kinds in STUDY_COMMANDS.items() for k in sorted(kinds)])
def test_the_fault_tolerance_study_quotes_its_tables_as_its_sweeps_give_them(folder, kind, capsys):
    """results/testbed/fault_tolerance/README.md, long/ and pairs/README.md: each row of the bench's tables, and
    each verdict on the registered rule, is what `python -m bench.fault_tolerance ... --report` prints from the
    committed sweeps today."""
    from bench import fault_tolerance

    study = STUDY / folder
    command = STUDY_COMMANDS[folder][kind]
    readme = (study / "README.md").read_text()
    assert command in " ".join(readme.replace("\\\n", " ").split())
    fault_tolerance.main([*command.split(), "--report", "--out", str(study), "train=learn"])
    printed = [line for line in capsys.readouterr().out.splitlines()
               if re.match(r"\| \d+ \|", line) or line.startswith(("- repeat ", "- seed ", "- over the ", "median"))]
    assert len(printed) >= 9, printed
    for line in printed:
        assert line in readme, line
