"""One package's conversion, as ``convert-model`` and ``--check-all`` run it: its sources gathered, converted, and
compared with what is on disk."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path, PurePosixPath

from common.atomic import recover
from common.errors import UserError
from converter import output
from converter.fetch import Fetcher, SourceFile, read_source_file
from converter.pipeline import Conversion, render
from converter.recipes import Recipe
from families import installed

DEFAULT_OUTPUT = Path("generated_models")
log = logging.getLogger("converter")


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


def invocation(args: argparse.Namespace) -> str:
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


def on_disk(root: Path, files: dict[PurePosixPath, str]) -> tuple[dict[PurePosixPath, str | None],
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
    current, changed, extras = on_disk(root, files)
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
                  invocation(args) + ("" if not extras else f" and remove {extras[0]}"))
        return 1
    log.info("%d generated files up to date under %s", len(files), root)
    return 0
