"""Print the config groups of conf/ and their options as a markdown table, each option described by the first
sentence of its file's leading comment, or of its dataclass's docstring for an option registered with Hydra's
ConfigStore (launcher.settings.REGISTERED); docs/launcher.md quotes the output (tests/test_docs.py checks it)."""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
sys.path.insert(0, str(ROOT))
from launcher.settings import REGISTERED  # noqa: E402


def summary(path: Path) -> str:
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("# ").strip())
    return first_sentence(" ".join(comment))


def registered(group: str, cls: type) -> str:
    what = "Every train key at its default" if group == "train" else first_sentence(" ".join(cls.__doc__.split()))
    return f"{what} (`{cls.__module__}.{cls.__name__}`, registered, no file; keys: [config-keys.md](config-keys.md))"


def first_sentence(text: str) -> str:
    text, depth = text + " ", 0
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
        options.update({name: registered(group.name, cls) for name, cls in REGISTERED.get(group.name, {}).items()})
        for name, what in sorted(options.items()):
            default = " (default)" if chosen.get(group.name) == name else ""
            print(f"| `{group.name}` | `{name}`{default} | {what} |")


if __name__ == "__main__":
    main()
