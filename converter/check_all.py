"""``convert-model --check-all``: every committed package against what the converter writes from its pinned release.

A package is a directory ``<output-dir>/<family>/v<release>/`` of a family with a recipe; its
release is the one its ``@generated`` header names (``# source: transformers X, ...``).  Each is
converted exactly as ``convert-model FAMILY --version X --check`` converts it (the same steps,
warnings and strictness) and compared with the files on disk.  The sources of a release come from

1. the source cache (``--cache-dir``, else ``$CONVERT_MODEL_CACHE`` or ``~/.cache/convert-model``);
2. else, for a verified release, a side-by-side install holding every file the recipe reads:
   the converter's (``<cache>/installs/<package>/<release>/``), then the setup's
   (``.venv/transformers/<release>/``), each file checked against the recipe's sha256 pins as
   ``--source-dir`` would be;
3. else what ``--check`` falls back to: the installed distribution, then the registry.

``--from`` limits this as it limits ``--check`` (``--from cache``: the cache only).  The packages
of one release are checked in one process, which parses each support file once; releases run in
``--jobs`` processes (default: one per CPU).  Exit 1 names every stale package and the command that
rewrites it; a package that cannot be checked (no header, no source, a failing conversion) is one
line naming it, and the run ends in exit 2 after checking all the others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import multiprocessing
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from converter import convert_one, installs
from converter.fetch import Fetcher
from converter.recipes import Recipe, load_recipes
from families import installed
from families.layout import version_dir

log = logging.getLogger("converter")
_SOURCE = re.compile(r"^# source: (\S+) (\S+), (\S+)$", re.M)
_REGENERATE = re.compile(r"^# regenerate: (.*)$", re.M)
_HEADER_CHARS = 8192


@dataclass(frozen=True)
class Package:
    family: str
    directory: Path
    version: str | None  # None: no readable @generated header naming the release
    problem: str = ""  # why it cannot be checked, when it cannot

    @property
    def name(self) -> str:
        return f"{self.family}/{self.directory.name}"


@dataclass(frozen=True)
class Result:
    package: str
    status: str  # "ok", "stale" or "error"
    stdout: str  # the diff and the missing/extra lines, as --check prints them
    messages: tuple[tuple[int, str], ...]  # log records (level, message), each message prefixed with the package


def packages(root: Path, recipes: dict[str, Recipe]) -> list[Package]:
    """Every package directory under ``root`` of a family with a recipe, with the release its header names."""
    found = []
    for family in sorted(recipes):
        base = root / family
        if not base.is_dir():
            continue
        for directory in sorted(p for p in base.iterdir() if p.is_dir() and p.name.startswith("v")):
            found.append(_package(family, directory, recipes[family]))
    return found


def _package(family: str, directory: Path, recipe: Recipe) -> Package:
    try:
        with open(directory / "__init__.py", encoding="utf-8", errors="replace") as handle:
            head = handle.read(_HEADER_CHARS)
    except OSError:
        head = ""
    source = _SOURCE.search(head)
    if source is None or (source.group(1), source.group(3)) != (recipe.package, recipe.source):
        return Package(family, directory, None, f"no @generated header naming its {recipe.package} release in "
                                                 f"{directory / '__init__.py'}")
    version = source.group(2)
    if version_dir(version) != directory.name:
        return Package(family, directory, version, f"its header names {recipe.package} {version}, which belongs "
                                                   f"in {directory.parent / version_dir(version)}")
    regenerate = _REGENERATE.search(head)
    if regenerate and ("--source-file" in regenerate.group(1) or "--source-dir" in regenerate.group(1)):
        return Package(family, directory, version, f"converted from a local file ({regenerate.group(1)}): check "
                                                   f"it with that command and --check")
    return Package(family, directory, version)


def _namespace(args: argparse.Namespace, package: Package) -> argparse.Namespace:
    """The arguments of ``convert-model FAMILY --version X --check`` for ``package``."""
    return argparse.Namespace(**{**vars(args), "family": package.family, "version": package.version,
                                 "check": True, "check_all": False, "source_file": None, "source_dir": None,
                                 "output_dir": package.directory.parent.parent})


def _sources(args: argparse.Namespace, recipe: Recipe) -> dict:
    """The recipe's files of the release: cache, a side-by-side install, then --check's own fallbacks."""
    cache_dir = args.cache_dir or installed.cache_dir()
    members = recipe.members_for(args.version)
    pins = recipe.pins.get(args.version)
    if args.origin in ("auto", "cache"):
        try:
            return Fetcher(recipe.package, args.version, cache_dir, "cache", pins or {}).fetch(members)
        except UserError:
            if args.origin == "cache":
                raise
    if args.origin == "auto" and pins is not None:
        for root in installed.install_roots(recipe.package, cache_dir):
            directory = installs.install_dir(args.version, root)
            if all((directory / member).is_file() for member in members):
                return convert_one.gather_sources(argparse.Namespace(**{**vars(args), "source_dir": directory}), recipe)
    return convert_one.gather_sources(args, recipe)


class _Collect(logging.Handler):
    """A package's log records, kept for the parent to log in package order (workers print nothing)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, f"{self.prefix}: {record.getMessage()}"))


def _check(args: argparse.Namespace, package: Package, recipes: dict[str, Recipe]) -> Result:
    """One package, as ``--check`` checks it: its log lines and stdout captured, prefixed with its name."""
    collect = _Collect(package.name)
    handlers, propagate = log.handlers[:], log.propagate
    log.handlers[:], log.propagate = [collect], False
    stdout = io.StringIO()
    try:
        if package.problem:
            raise UserError(package.problem)
        namespace = _namespace(args, package)
        recipe = recipes[package.family]
        with contextlib.redirect_stdout(stdout):
            code = convert_one.check(namespace, convert_one.convert(namespace, recipe, _sources(namespace, recipe)))
        status = "ok" if code == 0 else "stale"
    except UserError as error:
        collect.records.append((logging.ERROR, f"{package.name}: error: {error}"))
        status = "error"
    finally:
        log.handlers[:], log.propagate = handlers, propagate
    return Result(package.name, status, stdout.getvalue(), tuple(collect.records))


def _check_release(task: tuple[argparse.Namespace, list[Package]]) -> list[Result]:
    args, group = task
    recipes = load_recipes()
    return [_check(args, package, recipes) for package in group]


def _quiet_worker() -> None:
    """A worker leaves Ctrl-C and SIGTERM to the parent, which stops the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_DFL)


def run(args: argparse.Namespace) -> int:
    given = [flag for flag, value in (("FAMILY", args.family), ("--version", args.version),
                                      ("--source-file", args.source_file), ("--source-dir", args.source_dir))
             if value]
    if given:
        raise UserError(f"--check-all checks every package under --output-dir: drop {', '.join(given)}")
    root = args.output_dir
    if os.path.lexists(root) and not root.is_dir():
        raise UserError(f"--output-dir {root} is not a directory")
    found = packages(root, load_recipes())
    if not found:
        raise UserError(f"no generated packages under {root} (expected {root}/<family>/v<release>/)")
    by_release: dict[str, list[Package]] = {}
    for package in found:
        by_release.setdefault(package.version or "", []).append(package)
    tasks = sorted(((args, group) for group in by_release.values()), key=lambda task: -len(task[1]))
    jobs = min(args.jobs or os.cpu_count() or 1, len(tasks))
    if jobs == 1:
        groups = [_check_release(task) for task in tasks]
    else:
        with multiprocessing.get_context("fork").Pool(jobs, initializer=_quiet_worker) as pool:
            groups = pool.map(_check_release, tasks, chunksize=1)
    return _report(root, sorted((r for group in groups for r in group), key=lambda r: r.package))


def _report(root: Path, results: list[Result]) -> int:
    for result in results:
        if result.stdout:
            print(result.stdout, end="")
        for level, message in result.messages:
            log.log(level, "%s", message)
    stale = [r.package for r in results if r.status == "stale"]
    failed = [r.package for r in results if r.status == "error"]
    if failed:
        raise UserError(f"{len(failed)} of {len(results)} packages under {root} could not be checked: "
                        f"{', '.join(failed)}" + (f"; out of date: {', '.join(stale)}" if stale else ""))
    if stale:
        log.error("%d of %d packages under %s out of date: %s", len(stale), len(results), root, ", ".join(stale))
        return 1
    log.info("%d packages up to date under %s", len(results), root)
    return 0
