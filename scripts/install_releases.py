"""Install every transformers release a recipe verifies side by side, with its era's dependency pins.

Usage: python scripts/install_releases.py [--root DIR] [--eras FILE] [--jobs N]
       python scripts/install_releases.py --newest   # print the newest verified release's pip requirements

Where each fact lives: the releases are the verified releases of the recipes
(``[versions."X"]`` of ``families/recipe_data/*.toml``, with the sha256 of every file the
conversion reads, which tests/test_t5_releases.py checks the installs against); what else a
release needs to import is its era's line of ``scripts/transformers_releases.txt``, a release
range and pinned requirements, read by this script and by convert-model (which installs an unverified
release in its cache the same way to check its output): the mechanism is :mod:`converter.installs`.

Each release goes to ``<root>/<release>/`` (default ``.venv/transformers/``); code runs against it
with ``PYTHONPATH=<root>/<release>``. A failed or interrupted install never leaves a directory that
a later run would reuse (converter/installs.py says how). A directory
whose stamp matches its line is kept: a second run with nothing changed does no work. Directories
of releases no longer verified are removed. Exit 0 when every release is in place, 1 when an
install failed (one line per failure, then pip's output), 2 on a malformed era list (or recipe).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages, not an install's

from common.errors import UserError  # noqa: E402
from converter.installs import (  # noqa: E402
    ERAS_FILE,
    PARTIAL,
    STAMP,
    InstallError,
    Release,
    ReleaseListError,
    install,
    install_dir,
    is_installed,
    releases_for,
    tail,
    verified_releases,
)

DEFAULT_ROOT = REPO / ".venv" / "transformers"
__all__ = ["PARTIAL", "STAMP", "Release", "ReleaseListError", "install_dir", "is_installed", "main", "read_releases",
           "verified_releases"]


def read_releases(path: Path = ERAS_FILE, versions: list[str] | None = None) -> list[Release]:
    """``versions`` (default: the verified releases), each with the requirements of the one era admitting it."""
    return releases_for(verified_releases() if versions is None else versions, path)


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
    parser.add_argument("--newest", action="store_true",
                        help="install nothing: print the pip requirements of the newest verified release and its "
                             "era (scripts/setup.sh installs them as the venv's own transformers)")
    args = parser.parse_args(argv)
    try:
        releases = read_releases(args.eras)
    except (OSError, UserError) as exc:  # a ReleaseListError, or a recipe that does not load
        print(f"install-releases: error: {exc.one_line() if isinstance(exc, UserError) else exc}", file=sys.stderr)
        return 2
    if args.newest:  # verified_releases() is oldest first
        print(" ".join(releases[-1].pip_requirements))
        return 0
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
            print(tail(failure.output), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
