"""Pages that quote a script's output must quote what the script prints today, and links must resolve on a
fresh clone."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script,page", [("explaining_the_paper.py", "explaining-the-paper.md"),
                                         ("explaining_seed_002.py", "explaining-seed-002.md"),
                                         ("paper_schedule.py", "../results/plans/README.md")])
def test_an_explaining_page_quotes_its_script(script, page):
    out = subprocess.run([sys.executable, str(ROOT / "docs" / script)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    text = (ROOT / "docs" / page).read_text()
    missing = [line for line in out.splitlines() if line.strip() and line not in text]
    assert not missing, f"docs/{page} is stale; rerun docs/{script} and paste: {missing[:3]}"


def test_links_in_the_docs_point_to_committed_files():
    """A page (README, docs, committed results) linking a file git does not track is broken on a fresh clone."""
    import re

    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.splitlines())
    folders = {str(p) for f in tracked for p in Path(f).parents}
    pages = [p for p in tracked if p.endswith(".md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / page).read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = str((ROOT / page).parent.joinpath(target).resolve().relative_to(ROOT))
            if path not in tracked and path not in folders:
                broken.append(f"{page} -> {target}")
    assert not broken, f"links to files git does not track: {broken[:5]}"


def test_launcher_page_lists_every_config_group_option_from_conf():
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "config_groups.py")], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    page = (ROOT / "docs" / "launcher.md").read_text()
    assert out.strip() in page, "docs/launcher.md's config groups are stale: paste `python docs/config_groups.py`"
    from launcher.settings import REGISTERED  # train=base, data=KIND: dataclasses, no files
    assert out.count("\n") - 2 == len(list((ROOT / "conf").glob("*/*.yaml"))) + sum(map(len, REGISTERED.values()))


def test_layout_page_lists_every_module_of_the_tree():
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "modules.py")], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() in (ROOT / "docs" / "layout.md").read_text(), \
        "docs/layout.md's modules are stale: paste `python docs/modules.py`"
    modules = [line for line in out.splitlines() if line.startswith("| `") and "/` |" not in line]
    assert len(modules) == len([*(ROOT / "launcher").rglob("*.py"), *(ROOT / "train").rglob("*.py")])


def test_config_keys_page_is_the_schema():
    """docs/config-keys.md is `python -m train.contract.config`: every train and data key, its type, default,
    limit, meaning."""
    out = subprocess.run([sys.executable, "-m", "train.contract.config"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert (ROOT / "docs" / "config-keys.md").read_text() == out.stdout, \
        "regenerate: python -m train.contract.config > docs/config-keys.md"
