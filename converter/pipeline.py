"""Run a recipe's transforms over a source module and lay out the output files."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import PurePosixPath

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor

from converter import __version__
from converter.errors import ConvertError
from converter.fetch import SourceFile
from converter.recipes import Recipe, TransformStep
from transforms import REGISTRY
from transforms.analysis.syntax import is_docstring, is_import_line
from transforms.base import DEFER_IMPORT_EDITS, SUPPORT_SOURCES, TransformError
from transforms.options import OptionError

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
    raise ConvertError(f"{display_name}:{line}:{column}: source does not parse: {message}")


def _check_classes(tree: cst.Module, recipe: Recipe, display_name: str) -> None:
    defined = {stmt.name.value for stmt in tree.body if isinstance(stmt, cst.ClassDef)}
    for name in recipe.classes:
        if name not in defined:
            raise ConvertError(f"{display_name}: missing class {name} required by recipe {recipe.family!r}")


def transform_module(tree: cst.Module, recipe: Recipe, supports: dict[str, SourceFile],
                     version: str | None = None) -> cst.Module:
    """Apply the transforms of ``recipe`` that apply to release ``version``, in order.

    The result is a fixed point.  ``version`` None stands for a release the
    recipe knows nothing of: steps limited to release ranges are skipped.
    """
    context = CodemodContext(
        filename=PurePosixPath(recipe.source).name,
        full_module_name=recipe.module_name,
        full_package_name=recipe.module_name.rpartition(".")[0],
        scratch={SUPPORT_SOURCES: {m: s.text for m, s in supports.items()}, DEFER_IMPORT_EDITS: True},
    )
    for step in recipe.steps_for(version):
        tree = _apply(step, tree, context, recipe, version)
    if AddImportsVisitor.CONTEXT_KEY in context.scratch:
        tree = add_imports(tree, context)
    if RemoveImportsVisitor.CONTEXT_KEY in context.scratch:
        tree = RemoveImportsVisitor(context).transform_module(tree)
    for warning in context.warnings:
        log.warning("%s", warning)
    return tree


def _apply(step: TransformStep, tree: cst.Module, context: CodemodContext, recipe: Recipe,
           version: str | None) -> cst.Module:
    """One step: a source it does not fit is a one-line error, finding nothing a warning."""
    try:
        options = step.options_for(version)
    except OptionError as exc:  # overrides that only clash when combined
        raise ConvertError(f"recipe {recipe.family!r}, transform {step.name}, release {version}: {exc}") from None
    try:
        result = REGISTRY[step.name](context, options).transform_module(tree)
    except TransformError as exc:
        release = f"{recipe.package} {version}" if version else recipe.package
        raise ConvertError(f"transform {step.name} does not apply to {release}: {exc}") from None
    except Exception as exc:
        exc.add_note(f"(raised by transform {step.name}: a bug in the transform, not in the recipe or source)")
        raise
    if not step.optional and result.deep_equals(tree):
        context.warnings.append(f"transform {step.name} found nothing to rewrite (mark the step "
                                f"optional = true in the recipe if that is expected)")
    return result


def _is_import_block_statement(statement: cst.BaseStatement) -> bool:
    return is_import_line(statement) or is_docstring(statement)


def add_imports(tree: cst.Module, context: CodemodContext) -> cst.Module:
    """Apply the scheduled ``AddImportsVisitor`` edits, visiting only the leading import block.

    The visitor only reads and edits top-level imports, but walks the whole
    module to do it (about six parses' worth of time here).  When every top-level
    import is in the leading block, running it on that block alone gives the
    same module; otherwise it runs on the whole module.
    """
    body = list(tree.body)
    head = 0
    while head < len(body) and _is_import_block_statement(body[head]):
        head += 1
    later_imports = any(isinstance(small, (cst.Import, cst.ImportFrom))
                        for statement in body[head:] if isinstance(statement, cst.SimpleStatementLine)
                        for small in statement.body)
    if later_imports or head == 0:
        return AddImportsVisitor(context).transform_module(tree)
    edited = AddImportsVisitor(context).transform_module(tree.with_changes(body=body[:head], footer=()))
    return tree.with_changes(body=[*edited.body, *body[head:]])


def version_dir(version: str) -> str:
    return "v" + version.replace(".", "_").replace("-", "_")


def header(conv: Conversion) -> str:
    main = conv.sources[conv.recipe.source]
    lines = [
        f"# @generated by convert-model {__version__}. Do not edit by hand: regenerate.",
        f"# source: {conv.recipe.package} {conv.version}, {conv.recipe.source}",
        f"# sha256: {main.sha256}",
    ]
    for member in conv.recipe.support:
        lines.append(f"# support: {member} sha256 {conv.sources[member].sha256}")
    lines.append("# transforms: " + (", ".join(s.name for s in conv.recipe.steps_for(conv.version)) or "none"))
    lines.append(f"# regenerate: {conv.command}")
    return "\n".join(lines) + "\n"


def render(conv: Conversion, display_name: str) -> dict[PurePosixPath, str]:
    """Every file of the output layout, keyed by path relative to the output root."""
    recipe = conv.recipe
    tree = parse(conv.sources[recipe.source], display_name)
    _check_classes(tree, recipe, display_name)
    supports = {m: conv.sources[m] for m in recipe.support}
    code = transform_module(tree, recipe, supports, conv.version).code
    module_file = PurePosixPath(recipe.source).name
    try:  # a rewrite that breaks the syntax must not reach the output
        compile(code, module_file, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise ConvertError(f"{display_name}: the generated code does not compile (line {exc.lineno}: {exc.msg}); "
                           f"a transform of recipe {recipe.family!r} produced it") from None
    top = header(conv)
    package = PurePosixPath(recipe.family) / version_dir(conv.version)
    names = ", ".join(recipe.classes)
    exports = "".join(f'    "{name}",\n' for name in recipe.classes)
    return {
        # The root package is every family's: its header names none.
        PurePosixPath("__init__.py"): (f"# @generated by convert-model {__version__}. Do not edit by hand: regenerate.\n"
                                       '"""Generated model code, one package per family and release."""\n'),
        PurePosixPath(recipe.family) / "__init__.py": top + f'"""Generated {recipe.family} models."""\n',
        package / "__init__.py": (
            top + f"from .{module_file.removesuffix('.py')} import {names}\n\n__all__ = [\n{exports}]\n"
        ),
        package / module_file: top + "\n" + code,
    }
