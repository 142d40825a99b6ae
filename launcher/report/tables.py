"""Tables 3-4 laid out like the paper's: Markdown for the terminal, CSV with the raw numbers for analysis,
LaTeX (booktabs) to drop into a paper."""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

from launcher.report import stats
from launcher.report.paper import NAMES, TABLES, reproduces_paper
from launcher.report.results import SPREAD, group_repeats
from train.contract.result import PHASES, RunResult, Stats


def _sig3(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:.2f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def oriented(ratio: float, below: str, above: str = "") -> str:
    """A ratio read one way: `ratio`× when it is >= 1, else its inverse with the word for the other
    direction — "1.41× slower", never "0.708× faster"."""
    if "1.00" in (_sig3(ratio), _sig3(1 / ratio)):  # 0.999: equal to three figures, "1.00×", not "1.00× higher"
        return "1.00×"
    if ratio >= 1:
        return f"{_sig3(ratio)}×" + (f" {above}" if above else "")
    return f"{_sig3(1 / ratio)}× {below}"


FORMATS = {  # display formats by column kind; CSV always holds the raw value
    "auto": lambda v: f"{v:.4g}" if isinstance(v, float) else str(v),
    "text": str,
    "fixed": "{:.2f}".format,  # seconds, perplexities
    # "× faster / lower / less ... than FSDP" columns: below 1 the cell says the other direction in words
    "faster": lambda v: oriented(v, "slower"),
    "lower": lambda v: oriented(v, "higher"),
    "less": lambda v: oriented(v, "more"),
    "count": "{:,.0f}".format,  # tokens/s
    "percent": "{:+.1%}".format,  # a relative error held as a fraction
    "share": "{:.1%}".format,  # a fraction of a whole (MFU)
}
_LATEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
          "×": r"$\times$", "±": r"$\pm$", "–": "--"}


def _latex(text) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def _interval(value: float, low: float, high: float, kind: str) -> str:
    """A ratio's interval read the same way as the ratio (`oriented`): inverted with it below 1."""
    if kind in ("faster", "lower", "less") and value < 1:
        low, high = 1 / high, 1 / low
    return f" ({_sig3(low)}–{_sig3(high)})"


def _fmt(value, kind: str, separators: bool = True) -> str:
    if isinstance(value, tuple) and len(value) == 3:  # (ratio, low, high); no interval shows the ratio alone
        ratio, low, high = value
        text = _fmt(ratio, kind, separators)
        return text + _interval(ratio, low, high, kind) if ratio is not None and low is not None else text
    if isinstance(value, tuple):  # (mean, spread); spread None shows the mean alone
        mean, std = value
        if mean is None or std is None:
            return _fmt(mean, kind, separators)
        return f"{_fmt(mean, kind, separators)} ± {_fmt(std, kind, separators)}"
    if value is None:
        return "–"
    text = FORMATS[kind](value)
    return text if separators or kind != "count" else text.replace(",", "")


@dataclass
class Table:
    """Cells are numbers, strings, None, (mean, spread) pairs or (ratio, low, high) triples; `kinds` names each
    column's display format; `spread` names the pairs' second number in CSV headers (std, ci95)."""

    title: str
    columns: list[str]
    rows: list[list]
    kinds: list[str] | None = None
    notes: list[str] = field(default_factory=list)  # printed under the table (Markdown) or above it (LaTeX)
    spread: str = "std"
    headers: list[str] | None = None  # what a reader sees (Markdown, LaTeX), where the CSV keeps `columns`

    def __post_init__(self):
        """A row or kind list shorter than the columns would silently drop cells (zip): refuse it."""
        if self.kinds is not None and len(self.kinds) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(self.kinds)} kinds for {len(self.columns)} columns")
        short = next((row for row in self.rows if len(row) != len(self.columns)), None)
        if short is not None:
            raise ValueError(f"table {self.title!r}: a row of {len(short)} cells for {len(self.columns)} columns")

    def _kinds(self) -> list[str]:
        return self.kinds or ["auto"] * len(self.columns)

    def to_markdown(self) -> str:
        kinds = self._kinds()
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.headers or self.columns) + " |",
                 "|" + "|".join(":---" if k == "text" else "---:" for k in kinds) + "|"]
        lines += ["| " + " | ".join(_fmt(v, k) for v, k in zip(row, kinds)) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes] if self.notes else []
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """Raw numbers; a column of (mean, spread) pairs becomes '<col> mean' and '<col> <spread>', one of (ratio,
        low, high) triples '<col>', '<col> low' and '<col> high'."""
        width = [max((len(row[i]) for row in self.rows if isinstance(row[i], tuple)), default=1)
                 for i in range(len(self.columns))]
        heads = {1: lambda c: (c,), 2: lambda c: (f"{c} mean", f"{c} {self.spread}"),
                 3: lambda c: (c, f"{c} low", f"{c} high")}
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([h for c, w in zip(self.columns, width) for h in heads[w](c)])
        for row in self.rows:
            writer.writerow([x for v, w in zip(row, width)
                             for x in (v if isinstance(v, tuple) else (v,) + (None,) * (w - 1))])
        return out.getvalue()

    def to_latex(self) -> str:
        """A booktabs tabular (needs \\usepackage{booktabs}); the title goes in a comment above it."""
        kinds = self._kinds()

        def line(cells) -> str:
            return " & ".join(_latex(c) for c in cells) + r" \\"

        align = "".join("l" if k == "text" else "r" for k in kinds)
        body = [line(_fmt(v, k, separators=False) for v, k in zip(row, kinds)) for row in self.rows]
        head = [f"% {self.title}", *[f"% {note}" for note in self.notes]]
        return "\n".join([*head, rf"\begin{{tabular}}{{{align}}}", r"\toprule", line(self.headers or self.columns),
                          r"\midrule", *body, r"\bottomrule", r"\end{tabular}", ""])


def paper_order(result: dict) -> tuple:
    """The paper's strategy order, then F, then A, then the swept values."""
    return (list(NAMES).index(result["strategy"]), result["F"], result["A"] or 0,
            tuple(sorted(result.get("axes", {}).items())), result["run_id"])


def _ordered(results: list[RunResult]) -> list[dict]:
    return sorted(group_repeats(results), key=paper_order)


def _build(title: str, columns: list[tuple], rows: list[dict]) -> Table:
    """columns: (name, kind, cell(result)) triples."""
    return Table(title, [c[0] for c in columns], [[c[2](r) for c in columns] for r in rows], [c[1] for c in columns])


def planned_layout(r: dict) -> dict:
    """The layout a row's configuration was planned with: before any elastic resume changed it (retry_shrink)."""
    return r["layout_changes"][0]["from"] if r["layout_changes"] else r


def planned_world(r: dict) -> int:
    layout = planned_layout(r)
    return layout["F"] * layout["R"] * layout["S"]


def layout_cell(r: dict, degrees: bool = True) -> str:
    """(F,R,S) as planned, `pp=P tp=T` where above 1 (unless the table has columns for them), and
    `→ (F',R',S')*` where a run lost nodes and resumed on fewer (shrink_notes), and † where a fault was injected
    (fault_notes)."""
    cell = "({F},{R},{S})".format(**planned_layout(r))
    cell += "".join(f" {k}={r.get(k, 1)}" for k in ("pp", "tp") if degrees and r.get(k, 1) > 1)
    if r["layout_changes"]:
        cell += " → ({F},{R},{S})*".format(**r["layout_changes"][-1]["to"])
    return cell + " †" if r["faults"] else cell


def model_parallel(rows: list[dict]) -> bool:
    """Whether any row has pipeline stages or a tensor-parallel group: only then do tables get P and T columns,
    so sweeps without them keep their tables."""
    return any(r.get("pp", 1) * r.get("tp", 1) > 1 for r in rows)


def _config_columns(rows: list[dict]) -> list[tuple]:
    """Strategy, layout (with P and T columns where a row has them), A, then a column per key a multirun swept
    (launcher.multirun)."""
    swept = list(dict.fromkeys(key for r in rows for key in r["axes"]))
    degrees = model_parallel(rows)
    return [("Strategy", "text", lambda r: NAMES[r["strategy"]]),
            ("(F,R,S)", "text", lambda r: layout_cell(r, degrees=not degrees)),
            *([("P", "auto", lambda r: r.get("pp", 1)), ("T", "auto", lambda r: r.get("tp", 1))] if degrees else []),
            ("A", "auto", lambda r: r["A"]),
            *((key, "text", lambda r, key=key: r["axes"].get(key)) for key in swept)]


def reference_key(r: dict) -> tuple:
    """What a configuration is compared with FSDP at: the same planned size and the same swept values."""
    return planned_world(r), tuple(sorted(r["axes"].items()))


def shrink_notes(rows: list[dict]) -> list[str]:
    """One note per layout change: which run resumed where, and what its numbers then describe."""
    return [f"* {c['run_id']} resumed at step {c['at_step']} on (F,R,S)=({c['to']['F']},{c['to']['R']},"
            f"{c['to']['S']}) instead of ({c['from']['F']},{c['from']['R']},{c['from']['S']}) after losing nodes "
            f"(retry_shrink, train.elastic); {c['streams_dropped']} data stream(s) were not trained from there on. "
            f"Its time, throughput and perplexity mix the two layouts."
            for r in rows for c in r["layout_changes"]]


def fault_notes(rows: list[dict]) -> list[str]:
    """One note per injected fault (train.fault_step): what struck, and what the run paid for it."""
    return [_fault_note(f) for r in rows for f in r["faults"]]


def _fault_note(f: dict) -> str:
    if f["kind"] == "slow":
        return (f"† {f['run_id']}: federation group {f['group']} ran at {f['speed']:g} of its speed from step "
                f"{f['step']} on (train.fault_kind=slow); its time and throughput include it.")
    if f.get("left_out"):  # train.fault_tolerance=groups: the group never came back
        return (f"† {f['run_id']}: federation group {f['group']} killed after step {f['step']} (train.fault_step); "
                f"the other groups went on, but it had not come back when they ended: its job was cancelled and it "
                f"is left out of the final model (train.fault_tolerance=groups).")
    if "healed_step" in f:  # train.fault_tolerance=groups: the others went on, the group healed from them
        return (f"† {f['run_id']}: federation group {f['group']} killed after step {f['step']} (train.fault_step); "
                f"the other groups went on, and it was started again and healed from them at step "
                f"{f['healed_step']}, {f['fault_to_heal_s']:.1f} s after the fault, {f['tokens_lost']} tokens lost "
                f"(train.fault_tolerance=groups).")
    if "resumed_from_step" not in f:  # the attempt that resumed after it is not the one recorded
        return (f"† {f['run_id']}: federation group {f['group']} killed after step {f['step']} (train.fault_step); "
                f"what it cost is not recorded: the run's last attempt started after it.")
    return (f"† {f['run_id']}: federation group {f['group']} killed after step {f['step']} (train.fault_step); the "
            f"next attempt resumed from step {f['resumed_from_step']}, {f['steps_retrained']} step(s) "
            f"({f['tokens_retrained']} tokens) trained again, {f['fault_to_resume_s']:.0f} s from the fault to the "
            f"resume; its training time counts each step once, so those seconds are not in it.")


def span_note(results: list[RunResult]) -> str:
    """What a table's 95 % intervals span (issue 41): the repeats of one sweep, started when, on one cluster; they do
    not say how far another day or another machine of the same kind would move the result."""
    starts = sorted(r.started_at for r in results if r.started_at)
    when = ""
    if starts:
        first, last = starts[0][:16].replace("T", " "), starts[-1][:16].replace("T", " ")
        when = f", started {first}–{last[11:] if last[:10] == first[:10] else last} UTC"
    return (f"Intervals span the repeats (seeds) of this one sweep{when}, on the one cluster it ran on: seed-to-seed "
            f"and run-to-run variation within that session, not another day's or another machine's.")


def _paper(key: str):
    return lambda r: TABLES[r["strategy"]][key] if reproduces_paper(r) else None


def table3(results: list[RunResult], predicted: dict[str, float] | None = None) -> Table:
    """Training time, throughput and perplexity per configuration (n runs: mean ± 95 % CI), with ratios to the FSDP
    run of the same size, paired by seed; `predicted` (run id -> predicted communication / FSDP's, from plan.json)
    adds the cost model's view. Runs that have not learned (eval perplexity not below baseline_ppl) get no quality
    ratio."""
    predicted = predicted or {}
    rows = _ordered(results)
    fsdp: dict[int, dict] = {}
    for r in rows:
        if r["strategy"] == "fsdp":
            fsdp.setdefault(reference_key(r), r)
    spread = any(r["repeats"] > 1 for r in rows)

    def paired(key: str, r: dict):
        """FSDP's / this configuration's `key`: (ratio, low, high) over the seeds both ran once any configuration
        was repeated, else the ratio; None without an FSDP run of the same size."""
        base = fsdp.get(reference_key(r))
        if not base or base[key] is None or not r[key]:
            return None
        if not spread:
            return base[key] / r[key]
        seeds = sorted(set(base[f"{key}_by_repeat"]) & set(r[f"{key}_by_repeat"]))
        if not seeds:  # nothing to pair: the ratio of the means, no interval
            return base[key] / r[key], None, None
        return stats.paired_ratio(*([row[f"{key}_by_repeat"][k] for k in seeds] for row in (base, r)))

    def ratio(key: str):
        if key in SPREAD:
            return lambda r: paired(key, r)

        def cell(r):
            base = fsdp.get(reference_key(r))
            return base[key] / r[key] if base and base[key] is not None and r[key] else None
        return cell

    def quality(r):  # none where this run or its FSDP reference has not learned
        base = fsdp.get(reference_key(r))
        unlearned = r["learned"] is False or (base is not None and base["learned"] is False)
        return None if unlearned else paired("eval_ppl", r)

    def value(key: str):  # (mean, 95 % half-width over repeats) once any configuration was repeated
        return (lambda r: (r[key], r[f"{key}_ci"])) if spread else (lambda r: r[key])

    columns = [
        *_config_columns(rows),
        ("n", "auto", lambda r: r["repeats"]),
        ("Training time (s)", "fixed", value("train_time_s")),
        # timed apart from training, so shown beside it when there were any
        *([("Checkpoint time (s)", "fixed", lambda r: r["checkpoint_s"])]
          if any(r["checkpoint_s"] for r in rows) else []),
        ("Tokens/s", "count", value("tokens_per_s")),
        ("Train PPL", "fixed", lambda r: r["train_ppl"]),
        ("Eval PPL", "fixed", value("eval_ppl")),
        ("× faster than FSDP", "faster", ratio("train_time_s")),
        ("× lower eval PPL than FSDP", "lower", quality),
    ]
    baselines = any(r["learned"] is not None for r in rows)
    shared = {key: _one_value(rows, key) for key in ("baseline_ppl", "floor_ppl")}  # one eval set: a note, no column
    if baselines:
        columns += [*([("Baseline PPL", "fixed", lambda r: r["baseline_ppl"])] if shared["baseline_ppl"] is None
                      else []),
                    ("Learned", "text", lambda r: {True: "yes", False: "not learned", None: "–"}[r["learned"]])]

    def within_noise(r) -> str:
        """The measures whose seed-paired ratio to FSDP's has a 95 % interval holding 1: no difference shown."""
        if fsdp.get(reference_key(r)) is r:
            return ""
        same = []
        for name, cell in (("time", ratio("train_time_s")), ("eval PPL", quality)):
            value = cell(r)
            if isinstance(value, tuple) and value[1] is not None and value[1] <= 1 <= value[2]:
                same.append(name)
        return ", ".join(same)

    if spread:
        columns.append(("Within noise of FSDP", "text", within_noise))

    def less_comm(r):
        ratio = predicted.get(r["runs"][0])  # repeats share a layout, so a prediction
        return 1 / ratio if ratio else None

    if any(r["target_ppl"] is not None for r in rows):
        columns += [("Target PPL", "fixed", lambda r: r["target_ppl"]),
                    ("Time to target (s)", "fixed", lambda r: r["time_to_target_s"]),
                    ("× faster to target than FSDP", "faster", ratio("time_to_target_s"))]
    if any(map(less_comm, rows)):
        columns.append(("× less comm than FSDP (predicted)", "less", less_comm))
    if any(r["floor_ppl"] is not None for r in rows) and shared["floor_ppl"] is None:
        columns.append(("PPL floor", "fixed", lambda r: r["floor_ppl"]))
    if any(map(reproduces_paper, rows)):
        columns += [("Paper time (s)", "fixed", _paper("train_time_s")),
                    ("Paper eval PPL", "fixed", _paper("eval_ppl"))]
    table = _build("Table 3: training time, throughput and perplexity", columns, rows)
    table.spread = "ci95"
    table.notes.append(
        "n runs per configuration, seeds train.seed, train.seed + 1, ...: ± is the 95 % confidence half-width of the "
        "mean (Student t); ratios to FSDP are geometric means over the seeds both ran, with their 95 % interval in "
        "brackets, and \"Within noise of FSDP\" names the measures whose interval holds 1. " + span_note(results)
        if spread else
        "One run per configuration: every number is a single sample, so a difference of a few percent may be "
        "run-to-run noise (sweep.repeats=3 gives intervals).")
    if baselines:
        value_note = "" if shared["baseline_ppl"] is None else f" ({shared['baseline_ppl']:.2f} for every run here)"
        table.notes.append(f"Baseline PPL{value_note}: the best context-free (unigram) model of the eval data. A "
                           f"run whose eval perplexity is not below it has not learned; no quality ratio is printed "
                           f"for it.")
    if any(r["floor_ppl"] is not None for r in rows):
        value_note = "" if shared["floor_ppl"] is None else f" ({shared['floor_ppl']:.2f} for every run here)"
        table.notes.append(f"PPL floor{value_note}: the perplexity of the synthetic data's own source (its entropy "
                           f"rate): no model can go below it, so eval PPL near it means the run learned all there "
                           f"is. Evaluation time is in Table 4.")
    table.notes += shrink_notes(rows) + fault_notes(rows)
    return table


def _one_value(rows: list[dict], key: str) -> float | None:
    """The value every row has for `key`, when they share one (the same eval data), else None."""
    values = {r[key] for r in rows}
    return values.pop() if len(values) == 1 and None not in values else None


def _mean_std(stats: Stats):
    return stats.mean, stats.std


def table4(results: list[RunResult]) -> Table:
    """Phase times per step, mean ± std over the same steps (the paper's basis: aggregation counts the steps
    that do not average as 0), then aggregation per FedAvg event, about A times the per-step figure."""
    rows = _ordered(results)
    columns = [
        *_config_columns(rows),
        *[(f"{p.capitalize()} (s)" if p != "aggregation" else "Aggregation per step (s)", "fixed",
           lambda r, p=p: _mean_std(r["phases"][p]) if p != "aggregation" or r["A"] else None) for p in PHASES],
        ("Aggregation per FedAvg (s)", "fixed", lambda r: _mean_std(r["aggregation_event"])),
        ("FedAvg events", "auto", lambda r: r["aggregations"]),
        ("Eval (s)", "fixed", lambda r: r["eval_time_s"]),
    ]
    if any(map(reproduces_paper, rows)):
        columns += [(f"Paper {p} (s)" if p != "aggregation" else "Paper aggregation per step (s)", "fixed",
                     _paper(p)) for p in ("forward", "backward", "aggregation")]
    table = _build("Table 4: phase times (s, mean ± std over steps; aggregation also per FedAvg event)",
                   columns, rows)
    if any(not r["A"] for r in rows):
        table.notes.append("FSDP and HSDP never average (no A): their aggregation is \"–\", not the phase clock's "
                           "reading of an interval in which nothing crosses groups.")
    table.notes += shrink_notes(rows) + fault_notes(rows)
    return table
