"""`python -m launcher sweep=NAME [cluster=NAME] [action=run|plan|report] [results_dir=DIR] [overrides]`."""
from __future__ import annotations

import sys

from train.errors import FedshardError


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\nConfig groups live in conf/: cluster, sweep, model, train, data.")
        return 0
    from launcher.settings import compose

    try:
        settings = compose(argv)
        if settings.action == "plan":
            from launcher.plan import plan

            plan(settings)
            return 0
        if settings.action == "report":
            from launcher.report.results import load_results
            from launcher.report.write import write_report

            print(write_report(settings.sweep_dir, load_results(settings.sweep_dir)))
            return 0
        from launcher.run import run_sweep

        return run_sweep(settings)
    except FedshardError as exc:  # anything else is a bug: its traceback is kept
        print(f"fedshard: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedshard: interrupted; running jobs cancelled, manifest.jsonl is consistent: "
              "run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
