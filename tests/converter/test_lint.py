"""ruff and mypy, configured in pyproject.toml, pass on the code they cover."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("tool", [["ruff", "check", "--quiet"], ["mypy"]])
def test_tool_passes(tool: list[str]) -> None:
    executable = BIN / tool[0] if (BIN / tool[0]).exists() else shutil.which(tool[0])
    assert executable, f"{tool[0]} is not installed (the test extra in setup.cfg installs it)"
    result = subprocess.run([str(executable), *tool[1:]], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
