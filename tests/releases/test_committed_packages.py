"""Every committed package is what the converter writes from its release's own files: one ``convert-model --check-all``.

The sources are the side-by-side installs of scripts/setup.sh (``.venv/transformers/<release>/``,
checked against the recipes' sha256 pins), as ``--source-dir`` would read them: the cache given is
empty.  The committed files were written by an earlier run, so this is also the byte-identical
rerun of every conversion.  A stale package is named with its diff, as ``--check`` shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import REPO

from converter.cli import main


def test_every_committed_package_is_what_the_converter_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code = main(["--check-all", "--cache-dir", str(tmp_path / "empty-cache"), "--jobs", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.out[-6000:] + captured.err
    assert "found nothing" not in captured.err and "unverified" not in captured.err, captured.err
    packages = [path for path in (REPO / "generated_models").glob("*/v*") if path.is_dir()]
    assert {"t5", "llama", "gpt2", "bert", "roberta", "bart"} <= {path.parent.name for path in packages}
    assert f"{len(packages)} packages up to date" in captured.err
