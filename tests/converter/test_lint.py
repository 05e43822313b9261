"""ruff and mypy, configured in pyproject.toml, pass on the code they cover."""

from __future__ import annotations

import ast
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


OURS = ("common", "families", "converter", "transforms", "stateless", "partitioning", "generated_models")
SOURCES = [path for top in (*OURS[:-1], "scripts") for path in sorted((REPO / top).rglob("*.py"))]


def late_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import of one of our packages inside a function (``if TYPE_CHECKING:`` blocks apart:
    they import nothing at run time)."""
    found = []
    for function in (node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef,
                                                                                          ast.AsyncFunctionDef))):
        for node in ast.walk(function):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [(getattr(node, "lineno", 0), name) for name in names if name.split(".")[0] in OURS]
    return found


def test_no_function_imports_one_of_our_modules() -> None:
    """Arrows point down and no circle is held open by a late import: every import of our own modules is at the
    top of its module (third-party ones may wait: matplotlib, datasets, tokenizers are optional or heavy)."""
    assert len(SOURCES) > 100
    late = [f"{path.relative_to(REPO)}:{line} imports {name}" for path in SOURCES
            for line, name in late_imports(path.read_text(encoding="utf-8"))]
    assert late == [], late


def test_the_late_import_check_can_fail() -> None:
    assert late_imports("def f():\n    from partitioning.plan import Plan\n") == [(2, "partitioning.plan")]
    assert late_imports("def f():\n    import torch\n") == []
    assert late_imports("from common.errors import UserError\n") == []


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute imports; ours are all absolute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level}


@pytest.mark.parametrize(("runtime", "planner"), [("gpu", "solve"), ("train", "solve"), ("cost", "solve"),
                                                   ("ipu", "train")])
def test_the_runtime_reads_the_plans_contract_not_the_solver(runtime: str, planner: str) -> None:
    """What a run needs of a plan (its settings, the schedules' actions) sits on partitioning's floor
    (partitioning/settings.py, partitioning/schedules.py), which the solver reads too."""
    modules = sorted((REPO / "partitioning" / runtime).rglob("*.py"))
    assert modules
    above = [f"{path.relative_to(REPO)} imports {name}" for path in modules for name in sorted(imported(path))
             if name.startswith(f"partitioning.{planner}.") or name == f"partitioning.{planner}"]
    assert above == [], above
