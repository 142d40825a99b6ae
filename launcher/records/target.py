"""sweep.target=reference: a target perplexity taken from the reference strategy's own runs, which are run
first. It is written to <sweep dir>/target.json before any other run is submitted, so every other run has it in
its spec from its start: the target is declared before the runs it judges, not chosen after seeing them.

The target is the worst (highest) final eval perplexity over the reference repeats, so that every reference run
reaches it; the report judges the reference runs against it from their evaluation histories."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from launcher.sweep import Run
from train.contract.common import ConfigError, StateError, write_atomic
from train.contract.result import RunResult

REFERENCE = "fsdp"  # the strategy every ratio of Table 3 is taken against
FILE = "target.json"


class ReferenceTarget:
    """The sweep's runs split into the reference's (run first) and the others (run with the declared target)."""

    def __init__(self, sweep_dir: Path, runs: list[Run], train):
        if train.target_ppl is not None:
            raise ConfigError(f"sweep.target=reference declares the target from the {REFERENCE} runs, but "
                              f"train.target_ppl={train.target_ppl!r} declares one too: set only one")
        self.path = Path(sweep_dir) / FILE
        self.reference = [r for r in runs if r.spec.layout.strategy == REFERENCE]
        self.others = [r for r in runs if r.spec.layout.strategy != REFERENCE]
        if not self.reference:
            raise ConfigError(f"sweep.target=reference takes the target from the {REFERENCE} runs, but the sweep "
                              f"has none: add {REFERENCE} to sweep.strategies")
        nodes = sorted({r.nodes for r in self.reference})
        if len(nodes) > 1:
            raise ConfigError(f"sweep.target=reference needs one {REFERENCE} configuration, but the sweep runs it "
                              f"on {', '.join(map(str, nodes))} nodes: run one node count per sweep")
        self.declared = read(self.path)
        if self.declared is not None:
            self._apply()

    def declare(self, results: list[RunResult]) -> float:
        """Write target.json from the finished reference runs and put the target into the others' specs."""
        missing = sorted({r.run_id for r in self.reference} - {r.run_id for r in results})
        if missing:
            raise StateError(f"no target to declare: reference run(s) {', '.join(missing)} did not finish")
        self.declared = max(r.eval_ppl for r in results)
        write_atomic(self.path, json.dumps({
            "target_ppl": self.declared, "source": REFERENCE,
            "runs": {r.run_id: r.eval_ppl for r in sorted(results, key=lambda r: r.run_id)},
            "declared_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
            indent=2) + "\n")
        self._apply()
        print(f"target declared: eval perplexity {self.declared:.4g} (the worst final eval of "
              f"{len(results)} {REFERENCE} run(s)), written to {self.path} before the other runs", flush=True)
        return self.declared

    def _apply(self) -> None:
        for run in self.others:
            run.spec.train.target_ppl = self.declared


def read(path: Path) -> float | None:
    """The declared target in a target.json, None when there is none yet."""
    try:
        return float(json.loads(Path(path).read_text())["target_ppl"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{path} is not a declared target ({exc!r}); delete it and the runs judged by it") from None


def judged(sweep_dir: Path, results: list[RunResult]) -> list[RunResult]:
    """Results with the sweep's declared target applied where their spec had none (the reference runs)."""
    target = read(Path(sweep_dir) / FILE)
    if target is None:
        return results
    return [r.with_target(target) if r.target_ppl is None else r for r in results]


MIN_EVALUATIONS = 16  # fewer cannot resolve a time to target finer than a sixteenth of training


def resolution_note(settings) -> str | None:
    """A note when a target is declared but the runs evaluate too seldom to say when they reached it."""
    train = settings.train
    if train.target_ppl is None and settings.sweep.target is None:
        return None
    steps, every = train.steps, train.eval_every
    evaluations = steps // every + (steps % every > 0) if every else 1
    if evaluations >= MIN_EVALUATIONS:
        return None
    return (f"fedshard: note: a target is declared but each run evaluates {evaluations} time(s) "
            f"(train.steps={steps}, train.eval_every={every}): time to target is resolved only to the next "
            f"evaluation; set train.eval_every <= {steps // MIN_EVALUATIONS} for {MIN_EVALUATIONS} evaluations")
