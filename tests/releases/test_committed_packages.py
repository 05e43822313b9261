"""The committed packages are what the converter writes from their release's own files: one ``convert-model
--check-all`` over every package of the newest release and two of each other release, the next ones along the
releases and from one CI run to the next (release_process.suite_families), copied as they are committed.

The sources are the side-by-side installs of scripts/setup.sh (``.venv/transformers/<release>/``,
checked against the recipes' sha256 pins), as ``--source-dir`` would read them: the cache given is
empty.  The committed files were written by an earlier run, so this is also the byte-identical
rerun of every conversion.  A stale package is named with its diff, as ``--check`` shows it.
``convert-model --check-all`` itself checks them all (scripts/new_release.py runs it after a release is added).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import REPO
from support.release_process import run_index, suite_families

from converter.cli import main

GENERATED = REPO / "generated_models"


def chosen() -> list[Path]:
    """The packages this run checks: every one of the newest release, two of each other release."""
    by_release: dict[str, list[str]] = {}
    for package in sorted(path for path in GENERATED.glob("*/v*") if path.is_dir()):
        by_release.setdefault(package.name, []).append(package.parent.name)
    releases = [name[1:].replace("_", ".") for name in by_release]
    taken = []
    for name, families in by_release.items():
        release = name[1:].replace("_", ".")
        picked = {family for run in (2 * run_index(), 2 * run_index() + 1)
                  for family in suite_families(families, release, releases, run)}
        taken += [GENERATED / family / name for family in sorted(picked)]
    return taken


def test_the_committed_packages_checked_are_what_the_converter_writes(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    packages = chosen()
    families = {path.parent.name for path in GENERATED.glob("*/v*") if path.is_dir()}
    assert {path.parent.name for path in packages} == families  # every family in every run (the newest has all)
    assert {path.name for path in packages} == {path.name for path in GENERATED.glob("*/v*") if path.is_dir()}
    output = tmp_path / "generated_models"
    for marker in [GENERATED / "__init__.py", *(GENERATED / family / "__init__.py" for family in families)]:
        (output / marker.relative_to(GENERATED)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(marker, output / marker.relative_to(GENERATED))  # the layout's package markers, as committed
    for package in packages:
        shutil.copytree(package, output / package.parent.name / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(REPO)
    code = main(["--check-all", "--output-dir", str(output), "--cache-dir", str(tmp_path / "empty-cache"),
                 "--jobs", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.out[-6000:] + captured.err
    assert "found nothing" not in captured.err and "unverified" not in captured.err, captured.err
    assert f"{len(packages)} packages up to date" in captured.err
