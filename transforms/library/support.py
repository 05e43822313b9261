"""Copying code from a support file of the same release: what ``override_inherited`` and ``copy_definitions`` share.

A support file (a recipe ``support`` member, fetched with the modeling file
and pinned like it) is parsed once per process and text; a copied method or class
reads names the support file binds at its top level, which the generated
module must bind the same way.
"""

from __future__ import annotations

import builtins
import functools

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.names import bound_names, names_read
from transforms.analysis.scopes import ModuleIndex
from transforms.analysis.syntax import all_params
from transforms.library.base import SUPPORT_SOURCES, TransformError

BUILTINS = frozenset(dir(builtins)) | {"self"}  # names a copied definition never imports


class Support:
    """One support file: its tree, its top-level imports and definitions."""

    def __init__(self, context: CodemodContext, source: str) -> None:
        supports = context.scratch.get(SUPPORT_SOURCES, {})
        if source not in supports:
            raise TransformError(f"support file {source} was not fetched (list it in the recipe)")
        self.source = source
        self.module_name = source.removesuffix(".py").replace("/", ".")
        self.tree, self.index = _parsed(supports[source], self.module_name.rpartition(".")[0])

    def definition(self, name: str) -> cst.ClassDef | cst.FunctionDef | None:
        """The class or function the support file defines at top level under ``name``."""
        found = [s for s in self.tree.body if isinstance(s, (cst.ClassDef, cst.FunctionDef)) and s.name.value == name]
        return found[-1] if found else None

    def binding(self, name: str) -> str | None:
        """The absolute qualified name the support file's top-level import binds ``name`` to (None: not imported)."""
        root = self.index.root
        if name not in root.imports:
            return None
        return self.index.absolute_module(root.imports[name])

    def needs(self, node: cst.FunctionDef | cst.ClassDef, what: str) -> list[str]:
        """The names a copy of ``node`` reads from the module it lands in, each one the support file imports."""
        needed = sorted(free_names(node) - BUILTINS)
        for name in needed:
            if self.binding(name) is None:
                raise TransformError(f"{what} uses {name}, which {self.source} defines itself; cannot copy it")
        return needed

    def add_import(self, context: CodemodContext, name: str) -> None:
        """Import ``name`` into the module being transformed the way the support file imports it."""
        qualified = self.binding(name)
        assert qualified is not None
        if isinstance(self.index.root.bindings[name][-1], cst.ImportFrom):
            module, _, obj = qualified.rpartition(".")
            AddImportsVisitor.add_needed_import(context, module, obj, name if name != obj else None)
        else:  # import a / import a.b as c
            AddImportsVisitor.add_needed_import(context, qualified, None, name if name != qualified else None)


@functools.lru_cache(maxsize=4)
def _parsed(text: str, package: str) -> tuple[cst.Module, ModuleIndex]:
    """A support file's tree and index, made once per process: every transform and family of a release reads it.

    Trees are immutable and the index is only read, so conversions may share them
    (``convert-model --check-all`` converts every family of a release in one process).
    """
    tree = cst.parse_module(text)
    return tree, ModuleIndex(tree, package)


def free_names(node: cst.FunctionDef | cst.ClassDef) -> set[str]:
    """The names ``node`` reads that it does not bind itself: what the enclosing module must provide."""
    if isinstance(node, cst.FunctionDef):
        params = all_params(node.params, starred=True)
        # Annotations, defaults and decorators are evaluated in the enclosing scope,
        # even where a parameter has the same name (`device: device`).
        header: set[str] = set()
        for part in [*(p.annotation for p in params), *(p.default for p in params), node.returns,
                     *node.decorators]:
            if part is not None:
                header |= names_read(part)
        body = names_read(node.body) - bound_names(node.body) - {p.name.value for p in params}
        return header | body
    names: set[str] = set()
    for base in [*node.bases, *node.keywords, *node.decorators]:
        names |= names_read(base)
    assert isinstance(node.body, cst.IndentedBlock)
    bound_here: set[str] = set()  # a class body's names are visible to its later statements, not to its methods
    for statement in node.body.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            names |= free_names(statement)
        else:
            names |= names_read(statement) - bound_here
        bound_here |= bound_names(statement)
    return names
