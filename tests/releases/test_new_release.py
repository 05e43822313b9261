"""scripts/new_release.py: a release converted and checked family by family, one class a row, failures located.

Runs on transformers 5.23.0 as scripts/setup.sh installed it (.venv/transformers/5.23.0), GPT-2 only: once as it
is (every class passes, and --write writes what is committed), once with a source that a transform cannot take.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO, load_script

from converter import installs
from converter.recipes import get_recipe
from families.layout import version_dir

new_release = load_script("new_release")
RELEASE = "5.23.0"


@pytest.fixture(scope="module")
def setup_install() -> Path:
    release = installs.release_for(RELEASE, installs.verified_releases())
    assert installs.is_installed(release), f"transformers {RELEASE} is not installed: run bash scripts/setup.sh"
    return installs.install_dir(RELEASE)


def rows(out: str) -> dict[str, list[str]]:
    """class -> the table's cells after it (result, first failure, line)."""
    lines = [line for line in out.splitlines() if line.startswith("| ")][1:]
    return {cells[1]: cells[2:] for cells in ([c.strip() for c in line.strip("|").split(" | ")] for line in lines)}


def test_a_release_that_converts_and_equals_stock_passes_and_writes_only_where_asked(
        setup_install: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    committed = REPO / "generated_models" / "gpt2" / version_dir(RELEASE)
    before = {path: path.stat().st_mtime_ns for path in committed.iterdir()}
    code = new_release.main([RELEASE, "--families", "gpt2", "--root", str(setup_install.parent), "--write",
                             "--output-dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert rows(out) == {name: ["yes", "", ""] for name in get_recipe("gpt2").classes}
    written = tmp_path / "out" / "gpt2" / version_dir(RELEASE)
    for path in committed.glob("*.py"):  # what convert-model writes, to the byte
        assert (written / path.name).read_text(encoding="utf-8") == path.read_text(encoding="utf-8"), path.name
    assert {path: path.stat().st_mtime_ns for path in committed.iterdir()} == before


def test_a_source_a_transform_cannot_take_fails_every_class_naming_the_transform(
        setup_install: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    recipe = get_recipe("gpt2")
    install = tmp_path / RELEASE  # the files the conversion reads; no class is checked when it fails
    for member in recipe.members_for(RELEASE):
        (install / member).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(setup_install / member, install / member)
    (install / installs.STAMP).write_text((setup_install / installs.STAMP).read_text())
    source = install / recipe.source
    # the recipe removes the double-heads model; a function still using it cannot lose it
    source.write_text(source.read_text() + "\n\ndef double_heads():\n    return GPT2DoubleHeadsModel\n")
    code = new_release.main([RELEASE, "--families", "gpt2", "--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1, out
    found = rows(out)
    assert list(found) == list(recipe.classes)
    for result, step, _ in found.values():
        assert result.startswith("**no**: convert: transform remove_classes does not apply") and "double_heads" in result
        assert step == "transform remove_classes"


def test_a_family_the_release_lacks_fails_when_asked_for(setup_install: Path, capsys: pytest.CaptureFixture) -> None:
    code = new_release.main(["4.5.1", "--families", "llama", "--root", str(setup_install.parent)])
    out = capsys.readouterr().out
    assert code == 1
    assert [cells[0] for cells in rows(out).values()] == [
        f"**no**: not in transformers 4.5.1: no {get_recipe('llama').source}"] * len(get_recipe("llama").classes)


@pytest.mark.parametrize("argv, message", [
    (["5.x"], "malformed version '5.x'"),
    ([RELEASE, "--families", "gpt3"], "unknown family gpt3"),
    ([RELEASE, "--requirements", "huggingface_hub>=1"], "'huggingface_hub>=1' is not a pinned requirement"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_install(argv: list[str], message: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert new_release.main([*argv, "--root", str(tmp_path / "root")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "root").exists()


def test_a_failing_line_is_traced_to_the_transform_that_wrote_it_or_to_its_source_line(setup_install: Path) -> None:
    recipe = get_recipe("gpt2")
    converted = new_release.convert(recipe, RELEASE, setup_install)
    source = (setup_install / recipe.source).read_text(encoding="utf-8").splitlines()
    module = next(text for path, text in converted.files.items() if path.name == "modeling_gpt2.py").splitlines()
    kept_lines = {text.strip() for text in source}
    written = next(line.strip() for line in module  # a call of a runtime helper, which no source line makes
                   if "stateless." in line and "import" not in line and line.strip() not in kept_lines)
    kept = "class GPT2Model(GPT2PreTrainedModel):"
    assert kept in module
    step, line = new_release.explain(converted, RELEASE, f"GPT2Model (every input) raises TypeError: boom at "
                                                         f"modeling_gpt2.py:7: `{written}`")
    assert step.endswith(" wrote the line") and line == f"modeling_gpt2.py:7 `{written}`"
    assert step.removeprefix("transform ").removesuffix(" wrote the line") in [s.name for s in recipe.steps_for(RELEASE)]
    step, line = new_release.explain(converted, RELEASE, f"x at modeling_gpt2.py:9: `{kept}`")
    assert step == "the line is the source's"
    assert line == f"modeling_gpt2.py:9 `{kept}`, source line {source.index(kept) + 1}"
