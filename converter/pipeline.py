"""Run a recipe's transforms over a source module and lay out the output files."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from common import __version__
from common.errors import UserError
from common.schema import OptionError
from converter import verify
from converter.fetch import SourceFile
from converter.imports import remove_imports
from converter.recipes import Recipe, TransformStep
from families.layout import version_dir
from transforms import REGISTRY
from transforms.analysis.syntax import is_docstring, is_import_line
from transforms.library.base import DEFER_IMPORT_EDITS, EXPORTED_CLASSES, HEADER_NOTES, SUPPORT_SOURCES, TransformError

log = logging.getLogger("converter")


@dataclass(frozen=True)
class Conversion:
    recipe: Recipe
    version: str
    sources: dict[str, SourceFile]
    command: str


def parse(source: SourceFile, display_name: str) -> cst.Module:
    try:
        return cst.parse_module(source.text)
    except cst.ParserSyntaxError as exc:
        line, column, message = exc.raw_line, exc.raw_column + 1, str(exc).splitlines()[0]
    # CPython's own parser pinpoints most errors better than libcst's.
    try:
        compile(source.text, display_name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        line, column, message = exc.lineno or line, exc.offset or column, exc.msg
    except ValueError:
        pass
    raise UserError(f"{display_name}:{line}:{column}: source does not parse: {message}")


def _check_classes(tree: cst.Module, recipe: Recipe, display_name: str) -> None:
    defined = {stmt.name.value for stmt in tree.body if isinstance(stmt, cst.ClassDef)}
    for name in recipe.classes:
        if name not in defined:
            raise UserError(f"{display_name}: missing class {name} required by recipe {recipe.family!r}")


def _context(recipe: Recipe, supports: dict[str, SourceFile]) -> CodemodContext:
    return CodemodContext(
        filename=PurePosixPath(recipe.source).name,
        full_module_name=recipe.module_name,
        full_package_name=recipe.module_name.rpartition(".")[0],
        scratch={SUPPORT_SOURCES: {m: s.text for m, s in supports.items()}, DEFER_IMPORT_EDITS: True,
                 EXPORTED_CLASSES: recipe.classes},
    )


def transform_steps(tree: cst.Module, recipe: Recipe, supports: dict[str, SourceFile],
                    version: str | None = None, strict: bool = False, report: bool = True,
                    notes: list[str] | None = None) -> Iterator[tuple[str, cst.Module]]:
    """Each step's name and the tree after it, then ``("imports", final tree)``.

    The scheduled import edits are applied once, after the last step.
    ``version`` None stands for a release the recipe knows nothing of: steps
    limited to release ranges are skipped.  With ``strict`` (an unverified
    release), a step that finds nothing to rewrite is an error, not a warning;
    ``report`` False keeps the warnings quiet (a replay).  ``notes`` receives
    the header lines the steps asked for (what they specialized or assumed).
    """
    context = _context(recipe, supports)
    for step in recipe.steps_for(version):
        tree = _apply(step, tree, context, recipe, version, strict)
        yield step.name, tree
    if AddImportsVisitor.CONTEXT_KEY in context.scratch:
        tree = add_imports(tree, context)
    if RemoveImportsVisitor.CONTEXT_KEY in context.scratch:
        tree = remove_imports(tree, context)
    for warning in context.warnings if report else ():
        log.warning("%s", warning)
    if notes is not None:
        notes += context.scratch.get(HEADER_NOTES, [])
    yield "imports", tree


def transform_module(tree: cst.Module, recipe: Recipe, supports: dict[str, SourceFile],
                     version: str | None = None, strict: bool = False, notes: list[str] | None = None) -> cst.Module:
    """Apply the transforms of ``recipe`` that apply to release ``version``, in order (a fixed point)."""
    *_, (_, result) = transform_steps(tree, recipe, supports, version, strict, notes=notes)
    return result


def _apply(step: TransformStep, tree: cst.Module, context: CodemodContext, recipe: Recipe,
           version: str | None, strict: bool) -> cst.Module:
    """One step: a source it does not fit is a one-line error, finding nothing a warning."""
    release = f"{recipe.package} {version}" if version else recipe.package
    try:
        options = step.options_for(version)
    except OptionError as exc:  # overrides that only clash when combined
        raise UserError(f"recipe {recipe.family!r}, transform {step.name}, release {version}: {exc}") from None
    transform = REGISTRY[step.name]
    try:
        result = transform(context, options).transform_module(tree)
    except TransformError as exc:
        raise UserError(f"transform {step.name} does not apply to {release}: {exc}") from None
    except Exception as exc:
        exc.add_note(f"(raised by transform {step.name}: a bug in the transform, not in the recipe or source)")
        raise
    if not step.optional and result.deep_equals(tree):
        if strict:
            raise UserError(f"transform {step.name} does not apply to {release} (unverified): it found nothing "
                               f"to rewrite ({transform.DESCRIPTION})")
        context.warnings.append(f"transform {step.name} found nothing to rewrite (mark the step "
                                f"optional = true in the recipe if that is expected)")
    return result


def _is_import_block_statement(statement: cst.BaseStatement) -> bool:
    return is_import_line(statement) or is_docstring(statement)


def add_imports(tree: cst.Module, context: CodemodContext) -> cst.Module:
    """Apply the scheduled ``AddImportsVisitor`` edits, visiting only the leading import block.

    The visitor reads and edits only the imports before the module's first other statement
    (a docstring aside: libcst's ``_GatherTopImportsBeforeStatements``), and inserts the new
    ones after them, but walks the whole module, and copies it for its metadata (about six
    parses' worth of time here).  Running it on that block alone gives the same module, later
    top-level imports (T5 from 4.35) included: the visitor leaves them alone
    (tests/converter/test_golden.py).
    """
    body = list(tree.body)
    head = 0
    while head < len(body) and _is_import_block_statement(body[head]):
        head += 1
    if head == 0:
        return AddImportsVisitor(context).transform_module(tree)
    edited = AddImportsVisitor(context).transform_module(tree.with_changes(body=body[:head], footer=()))
    return tree.with_changes(body=[*edited.body, *body[head:]])


def header(conv: Conversion, notes: list[str]) -> str:
    """The ``@generated`` header of a release's files: its sources, transforms, specializations, command."""
    recipe, version = conv.recipe, conv.version
    main = conv.sources[recipe.source]
    steps = recipe.steps_for(version)
    lines = [
        f"# @generated by convert-model {__version__}. Do not edit by hand: regenerate.",
        f"# source: {recipe.package} {version}, {recipe.source}",
        f"# sha256: {main.sha256}",
    ]
    for member in recipe.support_for(version):
        lines.append(f"# support: {member} sha256 {conv.sources[member].sha256}")
    if version not in recipe.known_versions:
        lines.append(f"# UNVERIFIED: {recipe.package} {version} is not among the recipe's verified releases")
    lines.append("# transforms: " + (", ".join(s.name for s in steps) or "none"))
    lines += [f"# {line}" for line in notes]
    lines.append(f"# regenerate: {conv.command}")
    return "\n".join(lines) + "\n"


# The root and family packages are every release's (and the root every family's): their header names none.
SHARED_HEADER = f"# @generated by convert-model {__version__}. Do not edit by hand: regenerate.\n"


def render(conv: Conversion, display_name: str) -> dict[PurePosixPath, str]:
    """Every file of the output layout, keyed by path relative to the output root.

    The modeling file is checked before anything is returned (:mod:`converter.verify`): it
    compiles and its calls of functions it defines match their signatures; a failure names
    the transform that produced the offending line.
    """
    recipe, version = conv.recipe, conv.version
    source_tree = parse(conv.sources[recipe.source], display_name)
    _check_classes(source_tree, recipe, display_name)
    supports = {m: conv.sources[m] for m in recipe.support_for(version)}
    strict = version not in recipe.known_versions
    notes: list[str] = []
    code = transform_module(source_tree, recipe, supports, version, strict, notes).code
    module_file = PurePosixPath(recipe.source).name
    problem = verify.static_problem(code, module_file)
    if problem is not None:
        culprit = _culprit(source_tree, recipe, supports, version, module_file, problem)
        raise UserError(f"generated {module_file} for {recipe.package} {version}: {problem.message} "
                           f"(produced by {culprit})")
    top = header(conv, notes)
    package = PurePosixPath(recipe.family) / version_dir(version)
    names = ", ".join(recipe.classes)
    exports = "".join(f'    "{name}",\n' for name in recipe.classes)
    return {
        PurePosixPath("__init__.py"): SHARED_HEADER + '"""Generated model code, one package per family and release."""\n',
        PurePosixPath(recipe.family) / "__init__.py": SHARED_HEADER + f'"""Generated {recipe.family} models."""\n',
        package / "__init__.py": (
            top + f"from .{module_file.removesuffix('.py')} import {names}\n\n__all__ = [\n{exports}]\n"
        ),
        package / module_file: top + "\n" + code,
    }


def _culprit(source_tree: cst.Module, recipe: Recipe, supports: dict[str, SourceFile], version: str,
             module_file: str, problem: verify.Problem) -> str:
    """The first step after which the generated code has ``problem``'s kind of fault.

    Only run when a check failed: it replays the steps, checking the code after each.
    """
    if verify.static_problem(source_tree.code, module_file, problem.key) is not None:
        return "the source itself"
    for name, tree in transform_steps(source_tree, recipe, supports, version, report=False):
        if verify.static_problem(tree.code, module_file, problem.key) is not None:
            return f"transform {name}" if name != "imports" else "the import edits"
    return "an unknown step"
