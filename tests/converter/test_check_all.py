"""``convert-model --check-all``: every package under the output directory, each named when stale or uncheckable."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO, SOURCE_CACHE

from converter.cli import main

GENERATED = REPO / "generated_models"


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """Two committed 4.5.1 packages (their sources are in the committed cache) and the shared packages."""
    out = tmp_path / "out"
    for family in ("gpt2", "bart"):
        shutil.copytree(GENERATED / family / "v4_5_1", out / family / "v4_5_1")
        shutil.copy(GENERATED / family / "__init__.py", out / family / "__init__.py")
    shutil.copy(GENERATED / "__init__.py", out / "__init__.py")
    return out


def check_all(out: Path, *extra: str) -> list[str]:
    return ["--check-all", "--output-dir", str(out), "--cache-dir", str(SOURCE_CACHE), "--from", "cache", *extra]


def test_stale_and_uncheckable_packages_are_named(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(check_all(out_dir, "--jobs", "2")) == 0, capsys.readouterr()
    assert "2 packages up to date" in capsys.readouterr().err

    module = out_dir / "bart" / "v4_5_1" / "modeling_bart.py"
    module.write_text(module.read_text(encoding="utf-8").replace("import math", "import math  # edited"),
                      encoding="utf-8")
    assert main(check_all(out_dir, "--jobs", "1")) == 1
    captured = capsys.readouterr()
    assert "-import math  # edited" in captured.out and f"{out_dir}/bart/v4_5_1/modeling_bart.py" in captured.out
    assert "convert-model: bart/v4_5_1: 1 generated file(s) out of date" in captured.err
    assert captured.err.strip().splitlines()[-1] == (
        f"convert-model: 1 of 2 packages under {out_dir} out of date: bart/v4_5_1")

    (out_dir / "gpt2" / "v4_6_0").mkdir()  # a package without its header: reported, the others still checked
    assert main(check_all(out_dir)) == 2
    err = capsys.readouterr().err
    assert "convert-model: gpt2/v4_6_0: error: no @generated header naming its transformers release" in err
    assert err.strip().splitlines()[-1] == (
        f"convert-model: error: 1 of 3 packages under {out_dir} could not be checked: gpt2/v4_6_0; "
        "out of date: bart/v4_5_1")


@pytest.mark.parametrize(("extra", "message"), [
    (["t5"], "--check-all checks every package under --output-dir: drop FAMILY"),
    (["--version", "4.5.1"], "drop --version"),
])
def test_refused_with_one_package(extra: list[str], message: str, out_dir: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*check_all(out_dir), *extra]) == 2
    assert message in capsys.readouterr().err


def test_nothing_to_check_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(check_all(tmp_path)) == 2
    assert f"no generated packages under {tmp_path}" in capsys.readouterr().err
    assert main(["t5", "--version", "4.5.1", "--jobs", "2"]) == 2
    assert "--jobs goes with --check-all" in capsys.readouterr().err
