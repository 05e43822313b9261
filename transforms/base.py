"""The base every transform derives from."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import replace

import libcst as cst
from libcst.codemod import Codemod, VisitorBasedCodemodCommand
from libcst.helpers import get_absolute_module_from_package
from libcst.metadata import ScopeProvider

# Set in a context's scratch by a pipeline that applies every transform's
# scheduled import edits itself, once, after the last transform.
DEFER_IMPORT_EDITS = "transforms.defer_import_edits"


class Transform(VisitorBasedCodemodCommand):
    """A codemod command that resolves metadata without copying the tree first.

    libcst deep-copies the module before resolving metadata so that a tree
    shared with other code keeps unique node identities; that copy costs as
    much as parsing the file, once per transform.  The converter owns every
    tree it passes here (fresh from the parser or from the previous transform,
    which builds new nodes), so the copy buys nothing.

    Import edits scheduled with ``AddImportsVisitor``/``RemoveImportsVisitor``
    cost a full pass each; a pipeline may defer them (``DEFER_IMPORT_EDITS``)
    and apply them all at once.
    """

    def absolute_name(self, name: str) -> str:
        """A qualified name with a relative import's leading dots resolved against this file's package."""
        dots = len(name) - len(name.lstrip("."))
        if not dots:
            return name
        return get_absolute_module_from_package(self.context.full_package_name, name[dots:], dots) or name

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """What ``QualifiedNameProvider`` says of ``node``, read straight from the scopes.

        ``QualifiedNameProvider`` first walks the whole module to annotate every
        node; a transform that asks about a few nodes saves that pass by declaring
        ``ScopeProvider`` and asking here.  Relative imports come back absolute.
        """
        scope = self.get_metadata(ScopeProvider, node, None)
        return set() if scope is None else {self.absolute_name(q.name) for q in scope.get_qualified_names_for(node)}

    def transform_module(self, tree: cst.Module) -> cst.Module:
        if self.context.scratch.get(DEFER_IMPORT_EDITS):
            return Codemod.transform_module(self, tree)
        return super().transform_module(tree)

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module) -> Generator[cst.Module, None, None]:
        previous = self.context.wrapper
        wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
        with self.resolve(wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = replace(self.context, wrapper=previous)
