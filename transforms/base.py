"""The base every transform derives from."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.helpers import get_absolute_module_from_package
from libcst.metadata import ScopeProvider

from transforms.options import NoOptions, parse_options
from transforms.positions import located

# Keys of a context's scratch that the pipeline fills.
DEFER_IMPORT_EDITS = "transforms.defer_import_edits"
"""Set by a pipeline that applies every transform's scheduled import edits itself, once, after the last one."""
SUPPORT_SOURCES = "support_sources"
"""Other files of the same release (member path -> text) that transforms may read."""


class TransformError(ValueError):
    """The source lacks what a transform was asked to rewrite: the recipe does not fit this source.

    Raised on purpose by a transform and reported as one line naming it; any
    other exception out of a transform is a bug in it.
    """


class Transform(VisitorBasedCodemodCommand):
    """The base of every transform: typed options, qualified names, located warnings.

    ``Options`` is the transform's option schema (see :mod:`transforms.options`);
    a transform is built from an instance of it or from keyword arguments
    checked against it.

    Metadata is resolved without copying the tree first.

    libcst deep-copies the module before resolving metadata so that a tree
    shared with other code keeps unique node identities; that copy costs as
    much as parsing the file, once per transform.  The converter owns every
    tree it passes here (fresh from the parser or from the previous transform,
    which builds new nodes), so the copy buys nothing.

    Import edits scheduled with ``AddImportsVisitor``/``RemoveImportsVisitor``
    cost a full pass each; a pipeline may defer them (``DEFER_IMPORT_EDITS``)
    and apply them all at once.
    """

    Options: ClassVar[type[Any]] = NoOptions

    def __init__(self, context: CodemodContext, options: Any = None, /, **values: Any) -> None:
        super().__init__(context)
        if options is None:
            options = parse_options(self.Options, values)
        elif values or not isinstance(options, self.Options):
            raise TypeError(f"{type(self).__name__} takes one {self.Options.__name__} or keyword options")
        self.options = options

    def report(self, node: cst.CSTNode, message: str) -> None:
        """A warning about ``node`` (an original node of the tree being transformed), with its line."""
        self.warn(located(self, node, message))

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
