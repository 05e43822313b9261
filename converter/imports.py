"""The scheduled import removals, decided from the module index where it can tell, by libcst where it cannot.

libcst's ``RemoveImportsVisitor`` removes a scheduled import only when nothing uses it, and finds
out by resolving libcst's scope metadata for the whole module and walking it twice more (exports
and string annotations): about half of an LLM family's conversion.  Most scheduled removals are
easy to decide without it, for an import at module level that binds a plain name:

- **unused**: no ``Name`` anywhere reads the name, and no string literal contains it but
  docstrings and text constants (libcst also counts ``__all__`` entries and string annotations);
- **used**: something reads it that, by Python's scoping rules
  (:class:`~transforms.analysis.scopes.ModuleIndex`), resolves to the module's binding: a read in
  a function, class, lambda or comprehension wherever it stands, a read at module level in a
  statement after the import (libcst counts exactly these as references of the import).

When every scheduled import of the module is decided so, libcst's own visitor removes the unused
ones, given that answer instead of its metadata (and entering only statements, where imports
are); otherwise, say the only read at module level stands before the import, a dotted
``import a.b`` or an import inside a function, libcst decides the whole module as before.
Either way the same imports go, in libcst's words: the output is the same.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.helpers import get_absolute_module_from_package_for_import

from transforms.analysis.scopes import ModuleIndex
from transforms.library.dispatch import FastDispatch
from transforms.library.libcst_internals import scheduled_import_removals, set_unused_imports

# Nodes an import statement can be inside of; the fast pass enters nothing else.
_HOLDERS = (cst.Module, cst.BaseSuite, cst.BaseCompoundStatement, cst.SimpleStatementLine, cst.Else,
            cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.Import, cst.ImportFrom, cst.ImportAlias)


def remove_imports(tree: cst.Module, context: CodemodContext) -> cst.Module:
    """``RemoveImportsVisitor(context).transform_module(tree)``, the same result, mostly without scope metadata."""
    unused = _decide(tree, context)
    if unused is None:
        return RemoveImportsVisitor(context).transform_module(tree)
    remover = _KnownUnused(context, unused)
    return tree.visit(remover)


def _scheduled(context: CodemodContext) -> tuple[dict[str, str | None], dict[str, set[tuple[str, str | None]]]]:
    """The removals as ``RemoveImportsVisitor`` reads them: module imports, and names imported from a module."""
    modules: dict[str, str | None] = {}
    objects: dict[str, set[tuple[str, str | None]]] = {}
    for module, obj, alias in scheduled_import_removals(context):
        if obj is None:
            modules[module] = alias
        else:
            objects.setdefault(module, set()).add((obj, alias))
    return modules, objects


def _decide(tree: cst.Module, context: CodemodContext) -> dict[cst.ImportAlias, cst.Import | cst.ImportFrom] | None:
    """The scheduled import aliases nothing uses, or None when one of them needs libcst's analysis."""
    modules, objects = _scheduled(context)
    index = ModuleIndex(tree, context.full_package_name or "")
    strings: list[str] | None = None
    unused: dict[cst.ImportAlias, cst.Import | cst.ImportFrom] = {}
    imports: list[cst.Import | cst.ImportFrom] = [*index.nodes(cst.Import), *index.nodes(cst.ImportFrom)]
    for node in imports:
        for alias in _scheduled_aliases(node, modules, objects, context.full_package_name):
            bound = alias.evaluated_alias or alias.evaluated_name
            if "." in bound or index.scope_of(node) is not index.root:
                return None
            if isinstance(node, cst.ImportFrom) and (node.module is None or _dotted(node.module) == "__future__"):
                return None  # libcst never removes these
            reads = [read for scope in index.all_scopes for read in scope.reads.get(bound, ())]
            if not reads:
                if strings is None:
                    strings = _strings(index)
                if any(bound in text for text in strings):
                    return None
                unused[alias] = node
            elif not any(_refers(index, read, node, bound) for read in reads):
                return None
    return unused


def _strings(index: ModuleIndex) -> list[str]:
    """Every string literal that libcst might read names from: all but docstrings and text constants.

    libcst reads names from string annotations (inside annotations, subscripts and typing calls)
    and from ``__all__``; a statement of a lone string, or a string assigned whole to a name other
    than ``__all__`` (``GPT2_INPUTS_DOCSTRING = r\"\"\"...\"\"\"``), is neither.
    """
    found = []
    literals: list[cst.SimpleString | cst.FormattedStringText] = [*index.nodes(cst.SimpleString),
                                                                  *index.nodes(cst.FormattedStringText)]
    for node in literals:
        holder = index.parent(node)
        while isinstance(holder, (cst.ConcatenatedString, cst.FormattedString)):
            holder = index.parent(holder)
        if isinstance(holder, cst.Expr):
            continue
        if isinstance(holder, cst.Assign) and all(isinstance(t.target, cst.Name) and t.target.value != "__all__"
                                                  for t in holder.targets):
            continue
        found.append(node.value)
    return found


def _refers(index: ModuleIndex, read: cst.Name, node: cst.Import | cst.ImportFrom, bound: str) -> bool:
    """Whether libcst counts ``read`` as a reference of the module-level import ``node`` binding ``bound``."""
    scope = index.scope_of(read)
    if index.lookup(scope, bound) is not index.root:
        return False
    # In the import's own scope libcst counts only what comes after it.
    return scope is not index.root or index.statement_position(read) > index.statement_position(node)


def _scheduled_aliases(node: cst.Import | cst.ImportFrom, modules: dict[str, str | None],
                       objects: dict[str, set[tuple[str, str | None]]], package: str | None) -> list[cst.ImportAlias]:
    """The aliases of ``node`` that ``RemoveImportsVisitor`` would remove if unused (its matching, as it does it)."""
    if isinstance(node, cst.Import):
        return [alias for alias in node.names if alias.evaluated_name in modules
                and alias.evaluated_alias == modules[alias.evaluated_name]]
    if isinstance(node.names, cst.ImportStar):
        return []
    module = get_absolute_module_from_package_for_import(package, node)
    if module is None or module not in objects:
        return []
    return [alias for alias in node.names if (alias.evaluated_name, alias.evaluated_alias) in objects[module]]


def _dotted(node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node)


class _KnownUnused(FastDispatch, RemoveImportsVisitor):
    """libcst's remover, told which imports are unused instead of finding out; it enters only statements.

    It is run with ``tree.visit``, never ``transform_module``: no metadata is resolved, and the
    aliases it was told about are nodes of that very tree.
    """

    def __init__(self, context: CodemodContext, unused: dict[cst.ImportAlias, Any]) -> None:
        super().__init__(context)
        self._known = unused

    def visit_Module(self, node: cst.Module) -> None:
        set_unused_imports(self, self._known)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return isinstance(node, _HOLDERS) and self._dispatch_visit(node)
