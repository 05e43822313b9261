"""convert-model's checks that run the generated code (converter.trace_check): the first failure, with its line."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, SOURCE_CACHE

from converter.checks import spec
from converter.cli import main
from converter.recipes import get_recipe
from converter.trace_check import check

GENERATED = REPO / "generated_models"


@pytest.fixture(autouse=True)
def fresh_imports():
    """check() imports the package under one name (in convert-model, in a process of its own): forget it."""
    yield
    for name in [n for n in sys.modules if n.startswith("convert_model_check_")]:
        del sys.modules[name]


def test_the_committed_package_equals_stock_and_traces_on_every_path() -> None:
    """T5Model without decoder ids is no path (stock refuses it); every other input is left out once."""
    assert check(spec(get_recipe("t5"), "4.5.1", GENERATED, compare=True)) == (
        0, "3 classes, 10 paths; stock refuses 1 input combinations")


def _patched(tmp_path: Path, needle: str, replacement: str) -> tuple[Path, int]:
    shutil.copytree(GENERATED / "t5" / "v4_5_1", tmp_path / "t5" / "v4_5_1")
    module = tmp_path / "t5" / "v4_5_1" / "modeling_t5.py"
    source = module.read_text()
    assert source.count(needle) == 1
    module.write_text(source.replace(needle, replacement))
    return module, source[:source.index(needle)].count("\n") + 1


def test_a_check_of_chosen_classes_builds_and_runs_only_those(tmp_path: Path) -> None:
    """One class at a time: how scripts/new_release.py gives a verdict per class (the check stops at a failure)."""
    chosen = spec(get_recipe("t5"), "4.5.1", tmp_path, compare=True, classes=("T5EncoderModel",))
    assert list(chosen["classes"]) == list(chosen["inputs"]) == ["T5EncoderModel"]
    code, message = check({**chosen, "root": str(GENERATED)})
    assert code == 0 and message.startswith("1 classes,"), message


def test_a_data_dependent_branch_is_reported_with_its_generated_line(tmp_path: Path) -> None:
    needle = "        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)\n"
    _, line = _patched(tmp_path, needle, needle + "        if variance.sum() > 0:\n            variance = variance * 1\n")
    code, message = check(spec(get_recipe("t5"), "4.5.1", tmp_path, compare=False))
    assert code == 1
    assert message.startswith("T5Model (every input) does not trace with torch.fx: TraceError: "
                              "symbolically traced variables cannot be used as inputs to control flow")
    assert message.endswith(f"at modeling_t5.py:{line + 1}: `if variance.sum() > 0:`")


def test_an_output_that_differs_from_stock_is_reported(tmp_path: Path) -> None:
    """The generated code runs and traces, but computes something else: only the comparison with stock sees it."""
    needle = "        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)\n"
    _patched(tmp_path, needle, needle.replace("keepdim=True)", "keepdim=True) * 1.0001"))
    spec_of = spec(get_recipe("t5"), "4.5.1", tmp_path, compare=False)
    assert check(spec_of)[0] == 0
    del sys.modules[spec_of["import_name"]]
    code, message = check({**spec_of, "compare": True})
    assert code == 1
    assert message.startswith("T5Model (every input): output differs from stock (max |difference| ")


def test_verify_runs_the_fx_check_of_what_it_writes(tmp_path: Path, capsys) -> None:
    """.venv has transformers 4.5.1 installed: --verify builds and traces the classes before writing."""
    out = tmp_path / "out"
    assert main(["t5", "--version", "4.5.1", "--cache-dir", str(SOURCE_CACHE), "--from", "cache", "--verify",
                 "--output-dir", str(out)]) == 0
    assert ("fx check: every class traces with torch.fx, on every path it keeps (3 classes, 10 paths; "
            "stock refuses 1 input combinations)") in capsys.readouterr().err
    assert (out / "t5/v4_5_1/modeling_t5.py").is_file()


def test_verify_of_a_release_that_is_not_installed_is_an_error(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["t5", "--version", "4.18.0", "--cache-dir", str(SOURCE_CACHE), "--from", "cache", "--verify",
                 "--accept-unverified", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "convert-model: error: --verify: the installed transformers is 4.5.1, and no side-by-side install of "
        "4.18.0 is here")
    assert not out.exists()
