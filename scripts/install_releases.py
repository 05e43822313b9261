"""Install every transformers release a recipe verifies side by side, with its era's dependency pins.

Usage: python scripts/install_releases.py [--root DIR] [--eras FILE] [--jobs N]

Where each fact lives: the releases are the verified releases of the recipes
(``[versions."X"]`` of ``families/recipe_data/*.toml``, with the sha256 of every file the
conversion reads, which tests/test_t5_releases.py checks the installs against); what else a
release needs to import is its era's line of ``scripts/transformers_releases.txt``, a release
range and pinned requirements, which only this script reads.

Each release goes to ``<root>/<release>/`` (default ``.venv/transformers/``) with
``pip install --no-deps --no-compile --only-binary=:all: --target``, next to the torch of the
interpreter running this script; code runs against it with ``PYTHONPATH=<root>/<release>``.
A release is installed into a scratch directory, imported once from there (its version and
location checked), stamped with the exact requirements and only then renamed into place, so a
failed or interrupted install never leaves a directory that a later run would reuse. A directory
whose stamp matches its line is kept: a second run with nothing changed does no work. Directories
of releases no longer verified are removed. Exit 0 when every release is in place, 1 when an
install failed (one line per failure, then pip's output), 2 on a malformed era list (or recipe).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages, not an install's

from common.errors import UserError  # noqa: E402
from common.versions import Release as ReleaseNumber  # noqa: E402
from common.versions import VersionError, VersionRange  # noqa: E402
from converter.recipes import load_recipes  # noqa: E402

ERAS_FILE = REPO / "scripts" / "transformers_releases.txt"
DEFAULT_ROOT = REPO / ".venv" / "transformers"
STAMP = ".installed"
PARTIAL = ".partial-"
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+")
# Imported from the fresh directory before it is accepted: the package, its version, and
# modeling_utils, which pulls in every dependency model code needs at import time.
_PROBE = ("import sys, transformers, transformers.modeling_utils; "
          "print(transformers.__version__); print(transformers.__file__)")


class ReleaseListError(UserError):
    """A malformed era list, or one that does not fit the verified releases."""


class InstallError(RuntimeError):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Release:
    version: str
    requirements: tuple[str, ...]

    @property
    def pip_requirements(self) -> tuple[str, ...]:
        return (f"transformers=={self.version}", *self.requirements)

    @property
    def stamp(self) -> str:
        return " ".join(self.pip_requirements) + "\n"


def verified_releases() -> list[str]:
    """Every transformers release some recipe verifies, oldest first."""
    versions = {version for recipe in load_recipes().values() if recipe.package == "transformers"
                for version in recipe.known_versions}
    return sorted(versions, key=ReleaseNumber.parse)


def read_releases(path: Path = ERAS_FILE, versions: list[str] | None = None) -> list[Release]:
    """``versions`` (default: the verified releases), each with the requirements of the one era admitting it.

    The era list: ``<release range> <name>==<version>...`` per line, ``#`` comments.
    """
    versions = verified_releases() if versions is None else versions
    eras: list[tuple[str, VersionRange, tuple[str, ...]]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path.name}:{number}"
        try:
            era = VersionRange.parse(words[0])
        except VersionError as error:
            raise ReleaseListError(f"{where}: {error}") from None
        requirements = tuple(words[1:])
        for requirement in requirements:
            if not _REQUIREMENT.fullmatch(requirement) or requirement.lower().startswith("transformers=="):
                raise ReleaseListError(f"{where}: {requirement!r} is not a pinned requirement name==version "
                                       "(other than transformers itself)")
        eras.append((where, era, requirements))
    if not eras:
        raise ReleaseListError(f"{path}: no eras listed")
    releases = []
    for version in versions:
        matching = [(where, requirements) for where, era, requirements in eras if version in era]
        if len(matching) != 1:
            lines = " and ".join(where for where, _ in matching) or "no line"
            raise ReleaseListError(f"{path.name}: transformers {version}, a verified release, matches {lines}: "
                                   "exactly one era must give its dependency pins")
        releases.append(Release(version, matching[0][1]))
    for where, era, _ in eras:
        if not any(version in era for version in versions):
            raise ReleaseListError(f"{where}: {era} admits no verified release: remove the line")
    return releases


def install_dir(version: str, root: Path = DEFAULT_ROOT) -> Path:
    return root / version


def is_installed(release: Release, root: Path = DEFAULT_ROOT) -> bool:
    try:
        return (install_dir(release.version, root) / STAMP).read_text(encoding="utf-8") == release.stamp
    except OSError:
        return False


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def install(release: Release, root: Path, python: str = sys.executable) -> float:
    """Install one release under ``root``; returns the seconds it took."""
    started = time.monotonic()
    final = install_dir(release.version, root)
    partial = root / f"{PARTIAL}{release.version}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        command = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet",
                   "--no-deps", "--no-compile", "--only-binary=:all:", "--target", str(partial),
                   *release.pip_requirements]
        proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise InstallError(f"pip install of {' '.join(release.pip_requirements)} failed "
                               f"(exit {proc.returncode})", proc.stdout + proc.stderr)
        env = {**os.environ, "PYTHONPATH": str(partial)}
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL, cwd=partial)
        if probe.returncode != 0:
            raise InstallError(f"transformers {release.version} does not import from {partial}: "
                               f"{(_tail(probe.stderr, 1) or 'no output')}", probe.stderr)
        version, location = (probe.stdout.splitlines() + ["", ""])[:2]
        if version != release.version or not Path(location).resolve().is_relative_to(partial.resolve()):
            raise InstallError(f"importing from {partial} gave transformers {version} at {location}, "
                               f"not {release.version} from that directory")
        (partial / STAMP).write_text(release.stamp, encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return time.monotonic() - started


def _remove_stale(root: Path, releases: list[Release]) -> None:
    listed = {release.version for release in releases}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(PARTIAL):  # left by an interrupted run: never reused
            shutil.rmtree(entry)
        elif entry.is_dir() and entry.name not in listed and (entry / STAMP).is_file():
            print(f"install-releases: removing transformers {entry.name} (no longer verified)", file=sys.stderr)
            shutil.rmtree(entry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="install_releases.py", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="where the releases go")
    parser.add_argument("--eras", type=Path, default=ERAS_FILE, help="the dependency pins of each era")
    parser.add_argument("--jobs", type=int, default=2, help="installs run at once (default 2)")
    args = parser.parse_args(argv)
    try:
        releases = read_releases(args.eras)
    except (OSError, UserError) as exc:  # a ReleaseListError, or a recipe that does not load
        print(f"install-releases: error: {exc.one_line() if isinstance(exc, UserError) else exc}", file=sys.stderr)
        return 2
    args.root.mkdir(parents=True, exist_ok=True)
    _remove_stale(args.root, releases)
    todo = [release for release in releases if not is_installed(release, args.root)]
    if not todo:
        return 0

    def attempt(release: Release) -> tuple[Release, float | InstallError]:
        try:
            return release, install(release, args.root)
        except InstallError as exc:
            return release, exc

    failures = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for release, outcome in pool.map(attempt, todo):
            if isinstance(outcome, InstallError):
                failures.append(outcome)
                print(f"install-releases: error: transformers {release.version}: {outcome}", file=sys.stderr)
            else:
                print(f"install-releases: transformers {release.version} in {args.root / release.version} "
                      f"({outcome:.1f} s)", file=sys.stderr)
    for failure in failures:
        if failure.output:
            print(_tail(failure.output), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
