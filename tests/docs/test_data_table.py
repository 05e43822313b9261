"""docs/train-model.md's table of the data each class trains on is the one the recipes give (scripts/data_table.py,
run with the venv's own transformers, the newest verified release), and a page that drifted is found."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import REPO
from support.suite_release import user_environment

SCRIPT = REPO / "scripts" / "data_table.py"


def check(page: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--page", str(page)], env=user_environment(),
                          capture_output=True, text=True, timeout=300)


def test_the_page_s_data_table_is_the_recipes(tmp_path: Path) -> None:
    page = REPO / "docs" / "train-model.md"
    done = check(page)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in page.read_text().splitlines() if line.startswith("| ") and "ForCausalLM` |" in line]
    assert len(rows) >= 5, rows  # the LLM families' rows are there
    drifted = tmp_path / "train-model.md"
    drifted.write_text(page.read_text().replace(rows[0] + "\n", ""))
    done = check(drifted)
    assert done.returncode == 1 and "the data table differs from the recipes" in done.stderr, done.stderr
