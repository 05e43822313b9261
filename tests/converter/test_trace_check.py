"""convert-model's fx check (converter.trace_check): the first blocker, with its generated line."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, SOURCE_CACHE

from converter.cli import main
from converter.trace_check import check

GENERATED = REPO / "generated_models"


@pytest.fixture(autouse=True)
def fresh_imports():
    """check() imports the package under one name (in convert-model, in a process of its own): forget it."""
    yield
    for name in [n for n in sys.modules if n.startswith("convert_model_check_")]:
        del sys.modules[name]


def test_the_committed_package_traces() -> None:
    assert check(GENERATED, "t5", "4.5.1") == (0, "")


def test_a_data_dependent_branch_is_reported_with_its_generated_line(tmp_path: Path) -> None:
    shutil.copytree(GENERATED / "t5" / "v4_5_1", tmp_path / "t5" / "v4_5_1")
    module = tmp_path / "t5" / "v4_5_1" / "modeling_t5.py"
    needle = "        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)\n"
    source = module.read_text()
    assert source.count(needle) == 1
    module.write_text(source.replace(needle, needle + "        if variance.sum() > 0:\n            variance = variance * 1\n"))
    line = source[:source.index(needle)].count("\n") + 2
    code, message = check(tmp_path, "t5", "4.5.1")
    assert code == 1
    assert message.startswith("T5Model does not trace with torch.fx: TraceError: symbolically traced variables "
                              "cannot be used as inputs to control flow")
    assert message.endswith(f"at modeling_t5.py:{line}: `if variance.sum() > 0:`")


def test_verify_runs_the_fx_check_of_what_it_writes(tmp_path: Path, capsys) -> None:
    """.venv has transformers 4.5.1 installed: --verify builds and traces the classes before writing."""
    out = tmp_path / "out"
    assert main(["t5", "--version", "4.5.1", "--cache-dir", str(SOURCE_CACHE), "--from", "cache", "--verify",
                 "--output-dir", str(out)]) == 0
    assert "fx check: every class traces with torch.fx" in capsys.readouterr().err
    assert (out / "t5/v4_5_1/modeling_t5.py").is_file()


def test_verify_of_a_release_that_is_not_installed_is_an_error(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["t5", "--version", "4.18.0", "--cache-dir", str(SOURCE_CACHE), "--from", "cache", "--verify",
                 "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "convert-model: error: --verify: the installed transformers is 4.5.1, not 4.18.0")
    assert not out.exists()
