"""Print every module of launcher/ and train/ with the first sentence of its docstring, one table per folder;
docs/layout.md quotes the output (tests/test_docs.py checks it), so the page follows the tree."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("launcher", "launcher/settings", "launcher/slurm", "launcher/placement", "launcher/records",
           "launcher/report", "launcher/actions", "train", "train/contract", "train/data", "train/runtime",
           "train/parallel", "train/federation", "train/measure", "train/job")


def first_sentence(path: Path) -> str:
    """Up to the first '. ' of the module's docstring's first paragraph, on one line (`|` escaped for the table)."""
    text = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
    found = re.search(r"(?<=[A-Za-z0-9)`'\"])\.(\s|$)", text)
    return (text[:found.end()].strip() if found else text).replace("|", "\\|")


def main() -> None:
    for folder in FOLDERS:
        print(f"\n| `{folder}/` | |\n|---|---|")
        for path in sorted((ROOT / folder).glob("*.py")):
            print(f"| `{path.stem}` | {first_sentence(path)} |")


if __name__ == "__main__":
    main()
