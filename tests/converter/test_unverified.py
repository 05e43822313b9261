"""Exit 0 means it works: a release the recipe does not verify is checked against its own stock code first.

BERT's recipe verifies every release line; here it is read without its 4.10.3 pin, which makes 4.10.3 a
release between two verified ones (4.5.1, 4.15.0) as any unpinned release is. 4.10.3 is installed side by
side by the setup (.venv/transformers/4.10.3), so its conversion is checked against stock without the network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO, FakeIndex, isolate_pip

from converter import installs
from converter.cli import main
from families import registry

INSTALL = REPO / ".venv" / "transformers" / "4.10.3"
BERT = "transformers/models/bert/modeling_bert.py"
UTILS = "transformers/modeling_utils.py"


@pytest.fixture
def bert_4_10_3(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stock 4.10.3 tree, with BERT's recipe read as if it did not pin 4.10.3."""
    assert (INSTALL / BERT).is_file(), "run bash scripts/setup.sh (installs every release side by side)"
    documents = registry.recipe_documents()
    pin = re.compile(r'\[versions\."4\.10\.3"\]\n(?:[^\n\[]+\n)*')
    unpinned = [(name, pin.sub("", text) if name == "bert.toml" else text) for name, text in documents]
    assert unpinned != documents, "BERT's recipe no longer pins 4.10.3: take another release between two pinned ones"
    monkeypatch.setattr(registry, "recipe_documents", lambda: unpinned)
    return INSTALL


def args(tmp_path: Path, version: str, source: Path, *extra: str) -> list[str]:
    return ["bert", "--version", version, "--source-dir", str(source), "--cache-dir", str(tmp_path / "cache"),
            "--output-dir", str(tmp_path / "out"), *extra]


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("convert-model: error:")]


def test_an_unverified_release_that_converts_exactly_is_checked_then_written(
        tmp_path: Path, bert_4_10_3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every class equal to stock 4.10.3 in eval and tracing, each optional input absent once: exit 0."""
    assert main(args(tmp_path, "4.10.3", bert_4_10_3)) == 0
    err = capsys.readouterr().err
    assert (f"transformers 4.10.3 is unverified: checked against its stock code ({bert_4_10_3}): every class "
            "equal to stock in eval and traces with torch.fx, on every path it keeps (5 classes, 20 paths; stock "
            "refuses 0 input combinations)") in err
    assert (tmp_path / "out/bert/v4_10_3/modeling_bert.py").is_file()


def test_a_path_that_does_not_trace_is_one_line_and_writes_nothing(
        tmp_path: Path, bert_4_10_3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BertModel called without token_type_ids slices a buffer with a step, which buffer_slices leaves alone.

    Every input given, the model traces; ``--verify`` once traced only that path and passed it (issue 23).
    """
    needle = "buffered_token_type_ids = self.embeddings.token_type_ids[:, :seq_length]"
    text = (bert_4_10_3 / BERT).read_text(encoding="utf-8")
    assert text.count(needle) == 1
    source = tmp_path / "src"
    for member in (BERT, UTILS):
        (source / member).parent.mkdir(parents=True, exist_ok=True)
        (source / member).write_bytes((bert_4_10_3 / member).read_bytes())
    (source / BERT).write_text(text.replace(needle, needle[:-1] + ":1]"), encoding="utf-8")
    for extra in ((), ("--accept-unverified", "--verify")):  # the check against stock; the fx check alone
        assert main(args(tmp_path, "4.10.3", source, *extra)) == 2
        [line] = error_lines(capsys)
        assert "BertModel (without token_type_ids) does not trace with torch.fx: TypeError: slice indices must be " \
               "integers or None or have an __index__ method at modeling_bert.py:" in line
        assert line.endswith("`buffered_token_type_ids = self.embeddings.token_type_ids[:, :seq_length:1]`" +
                             (" (hint: pass --accept-unverified to write it unchecked)" if not extra else ""))
        assert not (tmp_path / "out").exists()


def test_no_verify_of_an_unverified_release_needs_the_flag_that_says_so(
        tmp_path: Path, bert_4_10_3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(tmp_path, "4.10.3", bert_4_10_3, "--no-verify")) == 2
    assert error_lines(capsys) == [
        "convert-model: error: --no-verify: transformers 4.10.3 is unverified, and only its check against stock code "
        "makes the conversion trustworthy (hint: pass --accept-unverified to write it unchecked)"]
    assert not (tmp_path / "out").exists()


def test_an_unverified_release_that_cannot_be_installed_is_one_line_and_writes_nothing(
        tmp_path: Path, bert_4_10_3: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """4.10.4 was never released: its (4.10.3) source converts, but there is no stock code to check it against."""
    index = FakeIndex(tmp_path / "index")
    index.add("0.1.0", {"extra/__init__.py": b""}, name="extra")
    isolate_pip(monkeypatch, index.url)
    assert main(args(tmp_path, "4.10.4", bert_4_10_3)) == 2
    [line] = error_lines(capsys)
    assert line.startswith("convert-model: error: transformers 4.10.4 is unverified and cannot be installed to check "
                           "the output against it: pip install of transformers==4.10.4 huggingface_hub==0.0.17 "
                           "failed (exit 1)")
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "cache/installs/transformers/4.10.4").exists()
    assert list((tmp_path / "cache/installs/transformers").iterdir()) == [], "the failed install left something"


@pytest.mark.parametrize("version,era", [("4.10.3", "4.10.3"), ("4.18.0", "4.15.0"), ("4.48.0", "4.46.3"),
                                         ("5.26.0", "5.25.0"), ("4.0.0", "4.5.1")])
def test_an_unverified_release_takes_the_pins_of_its_era_or_the_one_before(version: str, era: str) -> None:
    verified = installs.verified_releases()
    pins = {release.version: release.requirements for release in installs.releases_for(verified)}
    assert installs.release_for(version, verified) == installs.Release(version, pins[era])


def test_another_installed_release_is_named_with_the_one_asked_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """PYTHONPATH at another release: the installed source is not 'not found', it is another release."""
    monkeypatch.syspath_prepend(str(INSTALL))
    assert main(["t5", "--version", "4.5.1", "--from", "installed", "--no-verify", "--cache-dir",
                 str(tmp_path / "cache"), "--output-dir", str(tmp_path / "out")]) == 2
    assert error_lines(capsys) == [
        f"convert-model: error: transformers 4.5.1: the installed transformers is release 4.10.3 (in "
        f"{INSTALL.resolve()}), not 4.5.1 as --version asks (hint: pass --source-file PATH (or --source-dir DIR) "
        f"to convert a local copy)"]
