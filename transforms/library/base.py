"""The base every transform derives from."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar

import libcst as cst
from libcst import CSTNodeT
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import RemoveImportsVisitor

from common.schema import NoOptions, parse_options
from transforms.analysis.scopes import ModuleIndex
from transforms.library.dispatch import FastDispatch
from transforms.library.libcst_internals import set_up_without_matchers, uses_matcher_decorators
from transforms.library.positions import located

# Keys of a context's scratch that the pipeline fills.
DEFER_IMPORT_EDITS = "transforms.defer_import_edits"
"""Set by a pipeline that applies every transform's scheduled import edits itself, once, after the last one."""
SUPPORT_SOURCES = "support_sources"
"""Other files of the same release (member path -> text) that transforms may read."""
EXPORTED_CLASSES = "transforms.exported_classes"
"""The classes the generated module must provide (the recipe's), as a tuple of names."""
HEADER_NOTES = "transforms.header_notes"
"""Lines for the generated file's header, in order: what the steps specialized or assumed."""
_INDEX = "transforms.module_index"


class TransformError(ValueError):
    """The source lacks what a transform was asked to rewrite: the recipe does not fit this source.

    Raised on purpose by a transform and reported as one line naming it; any
    other exception out of a transform is a bug in it.
    """


class Transform(FastDispatch, VisitorBasedCodemodCommand):
    """The base of every transform: typed options, one name resolver, focused passes, located warnings.

    ``Options`` is the transform's option schema (see :mod:`common.schema`);
    a transform is built from an instance of it or from keyword arguments
    checked against it.

    Names: :attr:`index` is the :class:`ModuleIndex` of the tree being
    transformed (qualified names, scopes, nodes by kind), built once per tree
    and shared by consecutive transforms while the tree is unchanged.

    Speed: libcst rebuilds every node a transformer enters.  A transform that
    can tell which nodes it may rewrite returns them from :meth:`focus`; the
    pass then enters only those subtrees and the nodes above them, and every
    node whose children came back unchanged is kept as it was, so an unchanged
    tree comes back as the same object.

    Metadata providers, where a transform still declares one, are resolved
    without libcst's defensive copy of the tree: the converter owns every tree
    it passes here.  Import edits scheduled with ``AddImportsVisitor`` /
    ``RemoveImportsVisitor`` cost a full pass each; a pipeline may defer them
    (``DEFER_IMPORT_EDITS``) and apply them all at once.  Hooks are found by table
    (:mod:`transforms.library.dispatch`) unless the transform uses libcst's matcher decorators.
    """

    Options: ClassVar[type[Any]] = NoOptions

    def __init__(self, context: CodemodContext, options: Any = None, /, **values: Any) -> None:
        if _PLAIN.get(type(self)):
            # What libcst's set-up leaves in a class without matcher decorators (found so by the first
            # instance), without its three scans of the class's thousand-odd attributes per instance.
            Codemod.__init__(self, context)
            set_up_without_matchers(self)
        else:
            super().__init__(context)
        if options is None:
            options = parse_options(self.Options, values)
        elif values or not isinstance(options, self.Options):
            raise TypeError(f"{type(self).__name__} takes one {self.Options.__name__} or keyword options")
        self.options = options
        self._focus: set[int] | None = None
        self._targets: set[int] = set()
        self._inside = 0
        # Without matcher decorators, libcst's matcher bookkeeping per node decides nothing.  Decorators
        # are on methods, so one answer per class.
        plain = _PLAIN.get(type(self))
        if plain is None:
            plain = _PLAIN[type(self)] = not uses_matcher_decorators(self)
        self._plain = plain

    def note(self, line: str) -> None:
        """Say in the generated file's header what this step specialized or assumed (one line, once)."""
        notes = self.context.scratch.setdefault(HEADER_NOTES, [])
        if line not in notes:
            notes.append(line)

    # -- names and warnings ------------------------------------------------------------------------------
    @property
    def index(self) -> ModuleIndex:
        """The index of the module being transformed."""
        index = self.context.scratch.get(_INDEX)
        if not isinstance(index, ModuleIndex) or index.module is not self.module:
            index = ModuleIndex(self.module, self.context.full_package_name or "")
            self.context.scratch[_INDEX] = index
        return index

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names ``node`` (a name, attribute chain or call) may refer to; relative ones absolute."""
        return self.index.qualified_names(node)

    def remove_unused_import_of(self, name: str) -> None:
        """Schedule the removal of the top-level import that binds ``name``, done only if nothing then reads it."""
        root = self.index.root
        if name not in root.imports:
            return
        qualified = self.index.absolute_module(root.imports[name])
        if isinstance(root.bindings[name][-1], cst.ImportFrom):
            module, _, obj = qualified.rpartition(".")
            RemoveImportsVisitor.remove_unused_import(self.context, module, obj, name if name != obj else None)
        else:
            RemoveImportsVisitor.remove_unused_import(self.context, qualified, None,
                                                      name if name != qualified else None)

    def report(self, node: cst.CSTNode, message: str) -> None:
        """A warning about ``node`` (an original node of the tree being transformed), with its line."""
        self.warn(located(self, node, message))

    # -- focused passes ----------------------------------------------------------------------------------
    def focus(self) -> Iterable[cst.CSTNode] | None:
        """The original nodes whose subtrees this pass may rewrite, or None for the whole module."""
        return None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        self._focus = None
        targets = self.focus()
        if targets is not None:
            targets = list(targets)
            if not targets:
                return tree
            self._targets = {id(node) for node in targets}
            if all(any(node is statement for statement in tree.body) for node in targets):
                self._focus = self._targets | {id(tree)}  # top-level targets need no index
            else:
                index = self.index
                self._focus = self._targets | {id(parent) for node in targets for parent in index.ancestors(node)}
        return super().transform_module_impl(tree)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._focus is not None and not self._inside:
            if id(node) not in self._focus:
                return False
            if id(node) in self._targets:
                self._inside += 1
        elif self._inside:
            self._inside += 1
        return self._dispatch_visit(node) if self._plain else VisitorBasedCodemodCommand.on_visit(self, node)

    def on_leave(self, original_node: CSTNodeT, updated_node: CSTNodeT) -> CSTNodeT | cst.RemovalSentinel:
        if self._focus is not None:
            if self._inside:
                self._inside -= 1
            elif id(original_node) not in self._focus:
                return updated_node
        if updated_node is not original_node and _same_children(original_node, updated_node):
            updated_node = original_node
        if self._plain:
            return self._dispatch_leave(original_node, updated_node)
        return VisitorBasedCodemodCommand.on_leave(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if self._plain:
            FastDispatch.on_visit_attribute(self, node, attribute)
        else:
            VisitorBasedCodemodCommand.on_visit_attribute(self, node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if self._plain:
            FastDispatch.on_leave_attribute(self, original_node, attribute)
        else:
            VisitorBasedCodemodCommand.on_leave_attribute(self, original_node, attribute)

    # -- metadata ----------------------------------------------------------------------------------------
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


_FIELDS: dict[type, tuple[str, ...]] = {}
_PLAIN: dict[type, bool] = {}


def _same_children(original: cst.CSTNode, updated: cst.CSTNode) -> bool:
    """Whether ``updated`` is ``original`` rebuilt from the very same children."""
    if type(original) is not type(updated):
        return False
    kind = type(original)
    if kind not in _FIELDS:
        _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(original))
    for name in _FIELDS[kind]:
        before, after = getattr(original, name), getattr(updated, name)
        if before is after:
            continue
        if isinstance(before, (tuple, list)) and isinstance(after, (tuple, list)) and len(before) == len(after) \
                and all(b is a for b, a in zip(before, after)):
            continue
        if not isinstance(before, cst.CSTNode) and not isinstance(before, (tuple, list)) and before == after:
            continue
        return False
    return True
