"""Try a new transformers release on every family: install it, convert, check each class against its stock code.

Usage: python scripts/new_release.py X [--families gpt2,t5] [--requirements NAME==V ...] [--root DIR] [--jobs N]
                                       [--write [--output-dir DIR]] [-v]

1. Installs transformers X side by side (converter/installs.py, as scripts/install_releases.py does) under
   ``--root`` (default: convert-model's cache, ``<cache>/installs/transformers/``, where ``convert-model
   --version X`` then finds it), with the pins of the era line admitting X in scripts/transformers_releases.txt,
   or of the newest era before it, or ``--requirements``; an install whose stamp says those pins is reused.
2. Converts every family whose recipe's source file exists at X (``--families``: those, a missing one a
   failure) from that install, as ``convert-model FAMILY --version X --source-dir <install>`` would (an
   unverified X strictly: a transform that finds nothing to rewrite fails).
3. Checks each class of each converted family in a process importing X (converter/trace_check.py, the check
   ``convert-model`` runs on an unverified release): on every input path, eval output ``torch.equal`` to stock,
   and the model traces with torch.fx to a graph computing the same.

Prints a family x class markdown table on stdout: per failing class the failure, the first failing transform
(or, when the conversion went through, the check and the transform that wrote the failing generated line) and
that line, with its line in the release's source when the source has it. Nothing is written into
generated_models/ unless ``--write`` (then every family whose classes all pass is written as convert-model
writes it; its recipe still needs the release's pins to verify it). Exit 0 when every class passes, 1 when one
fails, 2 on bad input (a malformed release, an unknown family, a release pip cannot install).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages, not an install's

from common.cli import Parser, nonempty_path, positive_int, run  # noqa: E402
from common.errors import UserError  # noqa: E402
from converter import checks, installs  # noqa: E402
from converter import cli as convert_model  # noqa: E402
from converter.fetch import SourceFile, read_source_file, validate_version  # noqa: E402
from converter.pipeline import Conversion, parse, render, transform_steps  # noqa: E402
from converter.recipes import Recipe, load_recipes  # noqa: E402
from families import installed  # noqa: E402

PROG = "new-release"
log = logging.getLogger("converter")  # the converter's warnings (a step finding nothing) come out here too
_SNIPPET = re.compile(r"`([^`]+)`\s*(?:\(produced by [^)]*\))?$")  # the code line a failure message ends with
_STEP = re.compile(r"\btransform (\w+)")
_BUILD = ("does not import", "cannot be built", "this process imports", "no family definition")  # trace_check's exit 2


@dataclass(frozen=True)
class Verdict:
    family: str
    name: str  # the class
    failure: str = ""  # "" when it passes
    step: str = ""  # the first failing transform, or the check and the transform that wrote the line
    line: str = ""  # the failing line, generated and in the source


@dataclass(eq=False)  # one per family, told apart by identity
class Converted:
    recipe: Recipe
    sources: dict[str, SourceFile]
    files: dict[PurePosixPath, str]
    steps: list[tuple[str, str]] | None = None  # each step's code, replayed on the first failure to explain


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("version", help="the transformers release, e.g. 5.24.0")
    parser.add_argument("--families", help="comma-separated families (default: every one whose source X has)")
    parser.add_argument("--requirements", nargs="+", metavar="NAME==VERSION",
                        help="the pins to install X with, instead of its era line's")
    parser.add_argument("--root", type=nonempty_path, help="where X is installed (default: convert-model's cache)")
    parser.add_argument("--jobs", type=positive_int, default=2, help="check processes at once (default 2)")
    parser.add_argument("--write", action="store_true", help="write every family whose classes all pass")
    parser.add_argument("--output-dir", type=nonempty_path, default=REPO / "generated_models",
                        help="with --write: the generated layout's root (default: the repository's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks of internal errors")
    return parser


def _release(args: argparse.Namespace) -> installs.Release:
    if args.requirements:
        return installs.Release(args.version, installs.pinned_requirements(args.requirements, "--requirements"))
    return installs.release_for(args.version, installs.verified_releases())


def _install(release: installs.Release, root: Path) -> Path:
    if root.exists() and not root.is_dir():
        raise UserError(f"--root {root} is not a directory")
    if not installs.is_installed(release, root):
        print(f"{PROG}: installing {' '.join(release.pip_requirements)} in {root}", file=sys.stderr)
        try:
            seconds = installs.install(release, root)
        except installs.InstallError as exc:
            last = installs.tail(exc.output, 1)
            raise UserError(f"cannot install transformers {release.version}: {exc}" + (f": {last}" if last else ""),
                            hint="check the release exists, or pass --requirements") from None
        print(f"{PROG}: installed in {seconds:.0f} s", file=sys.stderr)
    return installs.install_dir(release.version, root)


def _recipes(args: argparse.Namespace) -> tuple[list[Recipe], bool]:
    """The families asked for (every transformers recipe by default), and whether they were named."""
    recipes = {family: recipe for family, recipe in load_recipes().items() if recipe.package == "transformers"}
    chosen = args.families.split(",") if args.families else list(recipes)
    unknown = [family for family in chosen if family not in recipes]
    if unknown:
        raise UserError(f"unknown family {', '.join(unknown)}; known: {', '.join(recipes)}")
    return [recipes[family] for family in chosen], bool(args.families)


def convert(recipe: Recipe, version: str, install: Path) -> Converted:
    """The package convert-model writes from ``install`` (a UserError when the conversion fails)."""
    sources = {}
    for member in recipe.members_for(version):
        if not (install / member).is_file():
            raise UserError(f"transformers {version} has no {member}, which the recipe reads")
        sources[member] = read_source_file(install / member, member)
    command = f"convert-model {recipe.family} --version {version}"
    return Converted(recipe, sources, render(Conversion(recipe, version, sources, command), recipe.source))


def located(message: str) -> tuple[str, str, str]:
    """(the code line a converter or check message ends with, ``file:line `code``` as it gives them, the message
    without the place when it ends with it: the table shows it in a column of its own); "" if none."""
    found = _SNIPPET.search(message)
    if found is None:
        return "", "", message
    where = re.findall(r"(\S+\.py:\d+)", message[:found.start()])
    snippet = found.group(1).strip()
    rest = re.sub(r"\s*(?:at\s+)?\S+\.py:\d+:?\s*$", "", message[:found.start()])
    return snippet, f"{where[-1] if where else 'generated'} `{snippet}`", rest + message[found.end():]


def explain(converted: Converted, version: str, message: str) -> tuple[str, str]:
    """(the transform that wrote the code line ``message`` ends with, that line and its line in the source)."""
    snippet, line, _ = located(message)
    if not snippet:
        return "", ""
    recipe = converted.recipe
    source = converted.sources[recipe.source]
    if converted.steps is None:  # replayed once per family: each step's output, the source first
        supports = {m: converted.sources[m] for m in recipe.support_for(version)}
        tree = parse(source, recipe.source)
        converted.steps = [("the source", tree.code)] + [
            (f"transform {name}" if name != "imports" else "the import edits", step_tree.code)
            for name, step_tree in transform_steps(tree, recipe, supports, version, report=False)]
    for name, code in converted.steps:
        lines = [text.strip() for text in code.splitlines()]
        if snippet in lines:
            if name == "the source":
                return "the line is the source's", f"{line}, source line {lines.index(snippet) + 1}"
            return f"{name} wrote the line", line
    return "", line


def check_class(converted: Converted, name: str, version: str, install: Path) -> str:
    """The check's one line when the class fails, "" when it passes."""
    try:
        passed, line = checks.run(converted.files, converted.recipe, version, checks.Install(install, str(install)),
                                  compare=True, classes=(name,))
    except UserError as exc:
        passed, line = False, exc.one_line()
    return "" if passed else line or "the check failed with no output"


def verdict(converted: Converted, name: str, version: str, failure: str) -> Verdict:
    if not failure:
        return Verdict(converted.recipe.family, name)
    kind = ("fx" if "torch.fx" in failure or "fx graph" in failure else
            "build" if any(word in failure for word in _BUILD) else "eval")
    step, where = explain(converted, version, failure)
    return Verdict(converted.recipe.family, name, located(failure)[2], f"check {kind}" + (f"; {step}" if step else ""),
                   where)


def _cell(text: str, limit: int = 300) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def table(verdicts: list[Verdict]) -> str:
    rows = ["| family | class | result | first failure | line |", "|---|---|---|---|---|"]
    for v in verdicts:
        result = "yes" if not v.failure else f"**no**: {_cell(v.failure)}"
        rows.append(f"| {v.family} | {v.name} | {result} | {_cell(v.step)} | {_cell(v.line)} |")
    return "\n".join(rows) + "\n"


def _write(args: argparse.Namespace, converted: Converted, install: Path) -> int:
    """convert-model's own write (all or nothing, never over a foreign file), the checks just run skipped."""
    recipe = converted.recipe
    words = [recipe.family, "--version", args.version, "--source-dir", str(install), "--output-dir",
             str(args.output_dir), "--no-verify", "-q"]
    return convert_model.main(words + ([] if args.version in recipe.pins else ["--accept-unverified"]))


def _execute(args: argparse.Namespace) -> int:
    validate_version(args.version)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING)
    log.propagate = False
    release = _release(args)
    recipes, named = _recipes(args)
    install = _install(release, args.root or installed.install_roots("transformers")[0])
    present = [recipe for recipe in recipes if (install / recipe.source).is_file()]
    absent = [recipe for recipe in recipes if recipe not in present]
    missing = absent if named else []  # a family asked for by name fails; the others are only mentioned
    if absent and not named:
        print(f"{PROG}: transformers {args.version} has no {', '.join(r.family for r in absent)}: not converted",
              file=sys.stderr)
    verdicts = [Verdict(r.family, name, f"not in transformers {args.version}: no {r.source}")
                for r in missing for name in r.classes]
    todo: list[tuple[Converted, str]] = []
    for recipe in present:
        handler.setFormatter(logging.Formatter(f"{PROG}: {recipe.family}: %(message)s"))  # its warnings, named
        try:
            converted = convert(recipe, args.version, install)
        except UserError as exc:
            found = _STEP.search(str(exc))
            step = f"transform {found.group(1)}" if found else "convert"
            _, where, rest = located(exc.one_line())
            verdicts += [Verdict(recipe.family, name, f"convert: {rest}", step, where) for name in recipe.classes]
            continue
        todo += [(converted, name) for name in recipe.classes]
    print(f"{PROG}: transformers {args.version}: {len(present)} families converted or tried, checking "
          f"{len(todo)} classes", file=sys.stderr)
    with ThreadPoolExecutor(args.jobs) as pool:  # each check is a process of its own
        failures = list(pool.map(lambda item: check_class(item[0], item[1], args.version, install), todo))
    verdicts += [verdict(converted, name, args.version, failure) for (converted, name), failure in zip(todo, failures)]
    order = [recipe.family for recipe in [*missing, *present]]
    verdicts.sort(key=lambda v: order.index(v.family))
    sys.stdout.write(table(verdicts))
    failing = {v.family for v in verdicts if v.failure}
    passing = [c for c in dict.fromkeys(c for c, _ in todo) if c.recipe.family not in failing]
    print(f"{PROG}: transformers {args.version}: {sum(not v.failure for v in verdicts)} of {len(verdicts)} classes "
          f"pass", file=sys.stderr)
    if args.write:
        if any(_write(args, converted, install) for converted in passing):
            return 2
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> int:
    return run(PROG, lambda words: _parser().parse_args(words), _execute, argv)


if __name__ == "__main__":
    sys.exit(main())
