"""Tables 3-4 and plots from a sweep's result.json / metrics.jsonl files, laid out like the paper's.

Markdown is for the terminal, CSV keeps the raw numbers for analysis, LaTeX (booktabs) drops into a paper.
Repeats of one configuration (run ids ending in -repN) become one row, so noise shows as a spread.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # cluster nodes have no display
import matplotlib.pyplot as plt  # noqa: E402

from train.spec import write_atomic  # noqa: E402

from . import topology  # noqa: E402
from .paper import NAMES, TABLES, reproduces_paper  # noqa: E402
from .verify import placement_rows  # noqa: E402

PHASES = ("forward", "backward", "optimizer", "aggregation")  # as in train.metrics, without importing torch
SPREAD = ("train_time_s", "tokens_per_s", "eval_ppl")  # fields whose spread over repeats is reported
_REPEAT = re.compile(r"-rep\d+$")


def load_results(sweep_dir: Path) -> list[dict]:
    """Every <run>/result.json under sweep_dir, sorted by run_id."""
    results = []
    for path in Path(sweep_dir).glob("*/result.json"):
        try:
            results.append(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
    return sorted(results, key=lambda r: r["run_id"])


def group_repeats(results: list[dict]) -> list[dict]:
    """One dict per configuration: numbers averaged over its repeats, phase stats pooled over all their steps,
    plus `repeats` and `<field>_std` (sample std over repeats; None for one run) for the SPREAD fields."""
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(_REPEAT.sub("", r["run_id"]), []).append(r)
    return [_merge(config, runs) for config, runs in groups.items()]


def _merge(config: str, runs: list[dict]) -> dict:
    if len(runs) == 1 and "repeats" in runs[0]:  # grouped already
        return runs[0]
    merged = dict(runs[0], run_id=config, repeats=len(runs))
    for key, value in runs[0].items():
        if _is_number(value):
            merged[key] = _mean([r[key] for r in runs if _is_number(r.get(key))])
    merged["phases"] = {p: _pool([r["phases"][p] for r in runs]) for p in runs[0]["phases"]}
    if "aggregation_event" in runs[0]:
        merged["aggregation_event"] = _pool([r["aggregation_event"] for r in runs])
    for key in SPREAD:
        merged[f"{key}_std"] = statistics.stdev(r[key] for r in runs) if len(runs) > 1 else None
    return merged


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mean(values: list):
    return values[0] if all(v == values[0] for v in values) else sum(values) / len(values)  # equal ints stay ints


def _pool(stats: list[dict]) -> dict:
    """Exact mean and population std over the union of the runs' samples, from each run's (mean, std, n)."""
    stats = [s for s in stats if s["n"] and s["mean"] is not None]
    n = sum(s["n"] for s in stats)
    if not n:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(s["n"] * s["mean"] for s in stats) / n
    square = sum(s["n"] * (s["std"] ** 2 + s["mean"] ** 2) for s in stats) / n
    return {"mean": mean, "std": math.sqrt(max(0.0, square - mean**2)), "n": n}


def _sig3(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:.2f}"
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


FORMATS = {  # display formats by column kind; CSV always holds the raw value
    "auto": lambda v: f"{v:.4g}" if isinstance(v, float) else str(v),
    "text": str,
    "fixed": "{:.2f}".format,  # seconds, perplexities
    "ratio": lambda v: _sig3(v) + "×",
    "count": "{:,.0f}".format,  # tokens/s
}
_LATEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
          "×": r"$\times$", "±": r"$\pm$", "–": "--"}


def _latex(text) -> str:
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def _fmt(value, kind: str, separators: bool = True) -> str:
    if isinstance(value, tuple):  # (mean, std); std None shows the mean alone
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
    """Cells are numbers, strings, None or (mean, std) tuples; `kinds` names each column's display format."""

    title: str
    columns: list[str]
    rows: list[list]
    kinds: list[str] | None = None

    def _kinds(self) -> list[str]:
        return self.kinds or ["auto"] * len(self.columns)

    def to_markdown(self) -> str:
        kinds = self._kinds()
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join(":---" if k == "text" else "---:" for k in kinds) + "|"]
        lines += ["| " + " | ".join(_fmt(v, k) for v, k in zip(row, kinds)) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        """Raw numbers; a column holding (mean, std) tuples becomes '<col> mean' and '<col> std'."""
        pair = [any(isinstance(row[i], tuple) for row in self.rows) for i in range(len(self.columns))]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([h for c, p in zip(self.columns, pair) for h in ((f"{c} mean", f"{c} std") if p else (c,))])
        for row in self.rows:
            writer.writerow([x for v, p in zip(row, pair) for x in ((v if isinstance(v, tuple) else (v, None)) if p else (v,))])
        return out.getvalue()

    def to_latex(self) -> str:
        """A booktabs tabular (needs \\usepackage{booktabs}); the title goes in a comment above it."""
        kinds = self._kinds()

        def line(cells) -> str:
            return " & ".join(_latex(c) for c in cells) + r" \\"

        align = "".join("l" if k == "text" else "r" for k in kinds)
        body = [line(_fmt(v, k, separators=False) for v, k in zip(row, kinds)) for row in self.rows]
        return "\n".join([f"% {self.title}", rf"\begin{{tabular}}{{{align}}}", r"\toprule", line(self.columns),
                          r"\midrule", *body, r"\bottomrule", r"\end{tabular}", ""])


def _order(result: dict) -> tuple:
    """The paper's strategy order, then F, then A."""
    return list(NAMES).index(result["strategy"]), result["F"], result["A"] or 0, result["run_id"]


def _ordered(results: list[dict]) -> list[dict]:
    return sorted(group_repeats(results), key=_order)


def _build(title: str, columns: list[tuple], rows: list[dict]) -> Table:
    """columns: (name, kind, cell(result)) triples."""
    return Table(title, [c[0] for c in columns], [[c[2](r) for c in columns] for r in rows], [c[1] for c in columns])


def _config_columns() -> list[tuple]:
    return [("Strategy", "text", lambda r: NAMES[r["strategy"]]),
            ("(F,R,S)", "text", lambda r: f"({r['F']},{r['R']},{r['S']})"),
            ("A", "auto", lambda r: r["A"])]


def _paper(key: str):
    return lambda r: TABLES[r["strategy"]][key] if reproduces_paper(r) else None


def table3(results: list[dict]) -> Table:
    """Training time, throughput and perplexity per configuration, with ratios to the FSDP run of the same size."""
    rows = _ordered(results)
    fsdp: dict[int, dict] = {}
    for r in rows:
        if r["strategy"] == "fsdp":
            fsdp.setdefault(r["world_size"], r)

    def ratio(key: str):
        def cell(r):
            base = fsdp.get(r["world_size"])
            return base[key] / r[key] if base and base[key] is not None and r[key] else None
        return cell

    spread = any(r["repeats"] > 1 for r in rows)

    def value(key: str):  # (mean, std over repeats) once any configuration was repeated
        return (lambda r: (r[key], r[f"{key}_std"])) if spread else (lambda r: r[key])

    columns = [
        *_config_columns(),
        *([("Runs", "auto", lambda r: r["repeats"])] if spread else []),
        ("Training time (s)", "fixed", value("train_time_s")),
        ("Tokens/s", "count", value("tokens_per_s")),
        ("Train PPL", "fixed", lambda r: r["train_ppl"]),
        ("Eval PPL", "fixed", value("eval_ppl")),
        ("Eval time (s)", "fixed", lambda r: r["eval_time_s"]),
        ("× faster than FSDP", "ratio", ratio("train_time_s")),
        ("× lower eval PPL than FSDP", "ratio", ratio("eval_ppl")),
    ]
    if any(r.get("checkpoint_s") for r in rows):  # timed apart from training, so shown beside it
        columns.insert(len(columns) - 6, ("Checkpoint time (s)", "fixed", lambda r: r.get("checkpoint_s")))
    if any(r.get("predicted_ratio_to_fsdp") for r in rows):  # from plan.json: the cost model's view
        columns.append(("× less comm than FSDP (predicted)", "ratio",
                        lambda r: 1 / r["predicted_ratio_to_fsdp"] if r.get("predicted_ratio_to_fsdp") else None))
    if any(r.get("floor_ppl") is not None for r in rows):
        columns.append(("PPL floor", "fixed", lambda r: r.get("floor_ppl")))
    if any(map(reproduces_paper, rows)):
        columns += [("Paper time (s)", "fixed", _paper("train_time_s")), ("Paper eval PPL", "fixed", _paper("eval_ppl"))]
    return _build("Table 3: training time, throughput and perplexity", columns, rows)


def _mean_std(stats: dict | None):
    return (stats["mean"], stats["std"]) if stats else None


def table4(results: list[dict]) -> Table:
    """Phase times per step, mean ± std over the same steps (the paper's basis: aggregation counts the steps
    that do not average as 0), then aggregation per FedAvg event, about A times the per-step figure."""
    rows = _ordered(results)
    columns = [
        *_config_columns(),
        *[(f"{p.capitalize()} (s)" if p != "aggregation" else "Aggregation per step (s)", "fixed",
           lambda r, p=p: _mean_std(r["phases"][p])) for p in PHASES],
        ("Aggregation per FedAvg (s)", "fixed", lambda r: _mean_std(r.get("aggregation_event"))),
        ("FedAvg events", "auto", lambda r: r["aggregations"]),
    ]
    if any(map(reproduces_paper, rows)):
        columns += [(f"Paper {p} (s)" if p != "aggregation" else "Paper aggregation per step (s)", "fixed",
                     _paper(p)) for p in ("forward", "backward", "aggregation")]
    return _build("Table 4: phase times (s, mean ± std over steps; aggregation also per FedAvg event)",
                  columns, rows)


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return path


def plots(sweep_dir: Path, results: list[dict]) -> list[Path]:
    """ppl_vs_time.png (train perplexity per step vs wall time, floor dashed) and phases.png (mean step, stacked)."""
    sweep_dir, results = Path(sweep_dir), sorted(results, key=_order)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        path = sweep_dir / r["run_id"] / "metrics.jsonl"
        steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        if steps:
            ax.plot([s["elapsed_s"] for s in steps], [s["ppl"] for s in steps], label=r["run_id"])
    for floor in sorted({r["floor_ppl"] for r in results if r.get("floor_ppl") is not None}):
        ax.axhline(floor, linestyle="--", color="grey", label=f"floor {floor:.2f}")
    ax.set(yscale="log", xlabel="elapsed (s)", ylabel="train perplexity", title="Train perplexity vs wall time")
    if ax.lines:
        ax.legend(fontsize=7)
    written = [_save(fig, sweep_dir / "ppl_vs_time.png")]

    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(results)), 4.5))
    x = list(range(len(results)))
    bottom = [0.0] * len(results)
    for phase in PHASES:
        heights = [r["phases"][phase]["mean"] or 0.0 for r in results]  # Table 4's per-step means
        ax.bar(x, heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(x, [r["run_id"] for r in results], rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="seconds per step", title="Mean step by phase (as Table 4: aggregation per step)")
    ax.legend(fontsize=7)
    written.append(_save(fig, sweep_dir / "phases.png"))
    return written


def write_report(sweep_dir: Path, results: list[dict]) -> str:
    """Write table3/table4 (and the achieved placement) as .md/.csv/.tex and the plots; return the markdown."""
    if not results:
        raise ValueError(f"no results under {sweep_dir}")
    sweep_dir = Path(sweep_dir)
    plan_path = sweep_dir / "plan.json"
    if plan_path.exists():  # put the cost model's prediction beside each measurement
        predicted = {e["run_id"]: e["predicted_ratio_to_fsdp"] for e in json.loads(plan_path.read_text())["runs"]}
        results = [{**r, "predicted_ratio_to_fsdp": predicted.get(r["run_id"])} for r in results]
    tables = {"table3": table3(results), "table4": table4(results)}
    topo_path = sweep_dir / "topology.json"
    if topo_path.exists():  # saved at submission: check where the ranks really ran
        columns, rows = placement_rows(results, topology.from_json(json.loads(topo_path.read_text())))
        tables["placement"] = Table("Placement achieved (slowest link per level, from where ranks ran)",
                                    columns, rows, ["text", "fixed", "fixed", "fixed", "text"])
    for name, table in tables.items():
        for ext, text in (("md", table.to_markdown()), ("csv", table.to_csv()), ("tex", table.to_latex())):
            write_atomic(sweep_dir / f"{name}.{ext}", text)
    plots(sweep_dir, results)
    return "\n".join(t.to_markdown() for t in tables.values())
