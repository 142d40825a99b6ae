"""Pages that quote a script's output must quote what the script prints today."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_explaining_the_paper_quotes_its_script():
    out = subprocess.run([sys.executable, str(ROOT / "docs" / "explaining_the_paper.py")], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    page = (ROOT / "docs" / "explaining-the-paper.md").read_text()
    missing = [line for line in out.splitlines() if line.strip() and line not in page]
    assert not missing, f"docs/explaining-the-paper.md is stale; rerun the script and paste: {missing[:3]}"
