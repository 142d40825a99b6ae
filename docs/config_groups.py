"""Print the config groups of conf/ and their options as a markdown table, each option described by the first
sentence of its file's leading comment; docs/launcher.md quotes the output (tests/test_docs.py checks it)."""
from __future__ import annotations

from pathlib import Path

import yaml

CONF = Path(__file__).resolve().parent.parent / "conf"
# options registered with Hydra's ConfigStore rather than written as files (launcher.settings.register_train_base)
REGISTERED = {"train": {"base": "Every train key at its default: TrainConfig's (train/config.py), registered with "
                                "Hydra's ConfigStore, not a file; the keys by concern: [train-keys.md](train-keys.md)"}}


def summary(path: Path) -> str:
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    text, depth = " ".join(comment) + " ", 0
    for i, char in enumerate(text):  # the first sentence: up to a '.' or ':' outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char in ".:" and depth == 0 and text[i + 1] == " ":
            return text[:i].replace("|", "/")
    return text.strip().replace("|", "/")


def defaults() -> dict[str, str]:
    """conf/config.yaml's defaults list: the option each group takes when none is typed."""
    entries = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    return {k: v for e in entries if isinstance(e, dict) for k, v in e.items()}


def main() -> None:
    print("| group | option | what it is |")
    print("|---|---|---|")
    chosen = defaults()
    for group in sorted(p for p in CONF.iterdir() if p.is_dir()):
        options = {option.stem: summary(option) for option in group.glob("*.yaml")}
        options.update(REGISTERED.get(group.name, {}))
        for name, what in sorted(options.items()):
            default = " (default)" if chosen.get(group.name) == name else ""
            print(f"| `{group.name}` | `{name}`{default} | {what} |")


if __name__ == "__main__":
    main()
