"""Side-by-side installs of exact transformers releases, each with its era's dependency pins.

Shared by ``scripts/install_releases.py`` (setup installs every verified release under
``.venv/transformers/<release>/``) and ``convert-model`` (an unverified release is installed in
its cache, ``<cache>/installs/<package>-<release>/``, and the output checked against it).

A release goes to its directory with ``pip install --no-deps --no-compile --only-binary=:all:
--target``, next to the torch of the interpreter; code runs against it with
``PYTHONPATH=<dir>``.  It is installed into a scratch directory, imported once from there (its
version and location checked), stamped with the exact requirements and only then renamed into
place, so a failed or interrupted install never leaves a directory that a later run would reuse.

What else a release needs to import is its era's line of ``scripts/transformers_releases.txt``:
a release range and pinned requirements.  A verified release must match exactly one line; any
other release takes the line admitting it or, between eras, the line of the newest era before it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from common.versions import Release as ReleaseNumber
from common.versions import VersionError, VersionRange
from converter.recipes import load_recipes
from families import installed
from families.installed import SIDE_BY_SIDE as SETUP_ROOT
from families.installed import STAMP

REPO = Path(__file__).resolve().parent.parent
ERAS_FILE = REPO / "scripts" / "transformers_releases.txt"
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


@dataclass(frozen=True)
class Era:
    where: str  # file:line
    releases: VersionRange
    requirements: tuple[str, ...]


def verified_releases() -> list[str]:
    """Every transformers release some recipe verifies, oldest first (the releases the era list admits)."""
    versions = {version for recipe in load_recipes().values() if recipe.package == "transformers"
                for version in recipe.known_versions}
    return sorted(versions, key=ReleaseNumber.parse)


def pinned_requirements(words: list[str], where: str) -> tuple[str, ...]:
    """``words`` if each is a pinned requirement ``name==version`` other than transformers; ``where`` names them."""
    for requirement in words:
        if not _REQUIREMENT.fullmatch(requirement) or requirement.lower().startswith("transformers=="):
            raise ReleaseListError(f"{where}: {requirement!r} is not a pinned requirement name==version "
                                   "(other than transformers itself)")
    return tuple(words)


def read_eras(path: Path = ERAS_FILE) -> list[Era]:
    """The era list: ``<release range> <name>==<version>...`` per line, ``#`` comments."""
    eras = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path.name}:{number}"
        try:
            releases = VersionRange.parse(words[0])
        except VersionError as error:
            raise ReleaseListError(f"{where}: {error}") from None
        eras.append(Era(where, releases, pinned_requirements(words[1:], where)))
    if not eras:
        raise ReleaseListError(f"{path}: no eras listed")
    return eras


def releases_for(versions: list[str], path: Path = ERAS_FILE) -> list[Release]:
    """The verified releases ``versions``, each with the requirements of the one era admitting it."""
    eras = read_eras(path)
    releases = []
    for version in versions:
        matching = [era for era in eras if version in era.releases]
        if len(matching) != 1:
            lines = " and ".join(era.where for era in matching) or "no line"
            raise ReleaseListError(f"{path.name}: transformers {version}, a verified release, matches {lines}: "
                                   "exactly one era must give its dependency pins")
        releases.append(Release(version, matching[0].requirements))
    for era in eras:
        if not any(version in era.releases for version in versions):
            raise ReleaseListError(f"{era.where}: {era.releases} admits no verified release: remove the line")
    return releases


def release_for(version: str, verified: list[str], path: Path = ERAS_FILE) -> Release:
    """Any release with its era's pins: the line admitting it, else that of the newest verified release before it.

    ``verified``: the verified releases, which the era lines admit.  Before every era, the oldest one's.
    """
    eras = read_eras(path)
    admitting = [era for era in eras if version in era.releases]
    if not admitting:
        number = ReleaseNumber.parse(version)
        ordered = sorted(verified, key=ReleaseNumber.parse)
        earlier = [v for v in ordered if ReleaseNumber.parse(v) <= number] or ordered[:1]
        admitting = [era for era in eras for v in earlier[-1:] if v in era.releases]
    return Release(version, admitting[0].requirements if admitting else ())


def install_dir(version: str, root: Path = SETUP_ROOT) -> Path:
    return root / version


def is_installed(release: Release, root: Path = SETUP_ROOT) -> bool:
    try:
        return (install_dir(release.version, root) / STAMP).read_text(encoding="utf-8") == release.stamp
    except OSError:
        return False


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def install(release: Release, root: Path, python: str = sys.executable) -> float:
    """Install one release under ``root``; returns the seconds it took."""
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
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
        env = {**os.environ, **installed.tokenizers_hidden(partial), "PYTHONPATH": str(partial)}
        probe = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL, cwd=partial)
        if probe.returncode != 0:
            raise InstallError(f"transformers {release.version} does not import from {partial}: "
                               f"{(tail(probe.stderr, 1) or 'no output')}", probe.stderr)
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
