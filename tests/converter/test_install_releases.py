"""scripts/install_releases.py: side-by-side installs that are complete or absent, never half there.

Installs run real pip against a local package index holding small transformers wheels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FakeIndex, isolate_pip, load_script

from converter.recipes import load_recipes

installer = load_script("install_releases")

GOOD = {"transformers/__init__.py": b'__version__ = "{version}"\n', "transformers/modeling_utils.py": b"X = 1\n"}


def members(version: str, **overrides: bytes | None) -> dict[str, bytes]:
    files = {name: data.replace(b"{version}", version.encode()) for name, data in GOOD.items()}
    for name, data in overrides.items():
        path = f"transformers/{name}.py"
        if data is None:
            files.pop(path)
        else:
            files[path] = data
    return files


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    fake = FakeIndex(tmp_path / "index")
    fake.add("9.9.1", members("9.9.1"))
    fake.add("9.9.2", members("9.9.2"))
    fake.add("9.9.3", members("9.9.3", modeling_utils=None))                        # imports, but not model code
    fake.add("9.9.4", members("9.9.4", __init__=b'__version__ = "1.0"\n'))           # claims another version
    fake.add("0.1.0", {"extra/__init__.py": b""}, name="extra")
    isolate_pip(monkeypatch, fake.url)
    return fake


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The releases the recipes verify, as the installer sees them: set by each test."""
    versions: list[str] = []
    monkeypatch.setattr(installer, "verified_releases", lambda: list(versions))
    return versions


def run(tmp_path: Path, verified: list[str], releases: str, eras: str,
        capsys: pytest.CaptureFixture) -> tuple[int, str, Path]:
    verified[:] = releases.split()
    path = tmp_path / "eras.txt"
    path.write_text(eras)
    root = tmp_path / "root"
    code = installer.main(["--root", str(root), "--eras", str(path), "--jobs", "2"])
    return code, capsys.readouterr().err, root


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


ERAS = "# comment\n==9.9.1\n==9.9.2   extra==0.1.0  # with a pinned dependency\n"


def test_install_then_nothing_to_do_then_reinstall_on_change(index, verified, tmp_path, capsys) -> None:
    code, err, root = run(tmp_path, verified, "9.9.1 9.9.2", ERAS, capsys)
    assert code == 0, err
    assert entries(root) == ["9.9.1", "9.9.2"]
    assert (root / "9.9.2" / "extra" / "__init__.py").is_file()
    assert (root / "9.9.1" / installer.STAMP).read_text() == "transformers==9.9.1\n"
    stamp = (root / "9.9.1" / installer.STAMP).stat().st_mtime_ns

    code, err, _ = run(tmp_path, verified, "9.9.1 9.9.2", ERAS, capsys)
    assert (code, err) == (0, ""), "a second run with nothing changed must do nothing"
    assert (root / "9.9.1" / installer.STAMP).stat().st_mtime_ns == stamp

    code, err, _ = run(tmp_path, verified, "9.9.1", "==9.9.* extra==0.1.0\n", capsys)  # 9.9.1 changed, 9.9.2 gone
    assert code == 0, err
    assert entries(root) == ["9.9.1"]
    assert (root / "9.9.1" / "extra").is_dir()
    assert "removing transformers 9.9.2" in err


@pytest.mark.parametrize("release,message", [
    ("9.9.7", "pip install of transformers==9.9.7 failed"),            # not on the index
    ("9.9.3", "transformers 9.9.3 does not import from"),              # no transformers.modeling_utils
    ("9.9.4", "gave transformers 1.0"),                                # not the release it claims to be
], ids=["not-released", "incomplete", "wrong-version"])
def test_a_failed_install_fails_loudly_and_leaves_nothing(index, verified, tmp_path, capsys, release,
                                                          message) -> None:
    code, err, root = run(tmp_path, verified, f"9.9.1 {release}", "==9.9.*\n", capsys)
    assert code == 1
    assert message in err and "install-releases: error: transformers" in err
    assert entries(root) == ["9.9.1"], "the failed release left a directory behind"


def test_a_broken_directory_is_replaced_not_reused(index, verified, tmp_path, capsys) -> None:
    code, _, root = run(tmp_path, verified, "9.9.1", "==9.9.*\n", capsys)
    assert code == 0
    (root / "9.9.1" / installer.STAMP).unlink()           # e.g. an older layout, or a hand-made directory
    (root / f"{installer.PARTIAL}9.9.2").mkdir()           # left by an interrupted run
    (root / f"{installer.PARTIAL}9.9.2" / "junk").write_text("x")
    code, err, _ = run(tmp_path, verified, "9.9.1 9.9.2", "==9.9.*\n", capsys)
    assert code == 0, err
    assert entries(root) == ["9.9.1", "9.9.2"]
    assert installer.is_installed(installer.Release("9.9.1", ()), root)
    assert not (root / "9.9.2" / "junk").exists()


@pytest.mark.parametrize("releases,eras,message", [
    ("4.5.1", "4.5\n", "'4.5' is not a release range"),
    ("4.5.1", "==4.5.*\n>=4\n", "matches eras.txt:1 and eras.txt:2"),
    ("4.5.1 4.6.0", "==4.5.*\n", "transformers 4.6.0, a verified release, matches no line"),
    ("4.5.1", "==4.5.*\n==4.6.*\n", "eras.txt:2: ==4.6.* admits no verified release"),
    ("4.5.1", "==4.5.* huggingface_hub\n", "'huggingface_hub' is not a pinned requirement"),
    ("4.5.1", "==4.5.* transformers==4.6.0\n", "other than transformers itself"),
    ("4.5.1", "# nothing\n", "no eras listed"),
])
def test_a_malformed_era_list_is_one_error_line_and_exit_2(verified, tmp_path, capsys, releases, eras,
                                                           message) -> None:
    code, err, root = run(tmp_path, verified, releases, eras, capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not root.exists()


def test_the_repository_release_list_is_well_formed() -> None:
    """Every release a recipe verifies is installed, with the pins of its era."""
    releases = installer.read_releases()
    assert releases[0].version == "4.5.1"
    assert all(r.version.count(".") == 2 for r in releases)
    assert {r.version for r in releases} == {v for recipe in load_recipes().values() for v in recipe.known_versions}
    requirements = {r.version: r.requirements for r in releases}
    assert requirements["4.5.1"] == () and requirements["4.10.3"] == ("huggingface_hub==0.0.17",)
