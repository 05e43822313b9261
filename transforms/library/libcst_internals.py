"""The one place the project reaches libcst's private names (libcst 1.x).

Two speed-ups need them: the table dispatch (:mod:`transforms.library.dispatch`, and
:class:`transforms.library.base.Transform` skipping the matcher set-up of a class without matcher
decorators) and the import removals decided without scope metadata (``converter/imports.py``).
The rest of the tree calls these functions, so a libcst release that renames one fails here and in
``tests/transforms/test_libcst_internals.py``, which names each one.  In ``transforms/library/``:
the lowest floor both users (transforms/, and converter/ above it) may import.
"""

from __future__ import annotations

from typing import Any

from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.matchers import MatcherDecoratableTransformer


def is_no_op_stub(function: Any) -> bool:
    """``function`` is one of the visitor base's empty ``visit_*`` / ``leave_*`` stubs (``_is_no_op``)."""
    return bool(getattr(function, "_is_no_op", False))


def uses_matcher_decorators(transformer: MatcherDecoratableTransformer) -> bool:
    """Whether ``transformer``'s class has matcher-decorated methods or ``@m.call_if_*`` guards: what
    ``MatcherDecoratableTransformer.__init__`` gathers (``_matchers``, ``_extra_visit_funcs``,
    ``_extra_leave_funcs``)."""
    return bool(transformer._matchers or transformer._extra_visit_funcs or transformer._extra_leave_funcs)


def set_up_without_matchers(transformer: MatcherDecoratableTransformer) -> None:
    """The matcher state ``MatcherDecoratableTransformer.__init__`` leaves in a class without matcher decorators,
    set without its scans of the class's attributes (the caller runs the rest of ``__init__``)."""
    transformer._matchers = {}
    transformer._extra_visit_funcs = {}
    transformer._extra_leave_funcs = {}


def scheduled_import_removals(context: CodemodContext) -> list[tuple[str, str | None, str | None]]:
    """The removals scheduled on ``context`` by ``RemoveImportsVisitor.remove_unused_import``: (module, name or
    None for ``import module``, alias or None), as ``RemoveImportsVisitor._get_imports_from_context`` reads them."""
    return list(RemoveImportsVisitor._get_imports_from_context(context))


def set_unused_imports(remover: RemoveImportsVisitor, unused: dict[Any, Any]) -> None:
    """Tell ``remover`` which import aliases are unused (its ``_unused_imports``: alias -> the import statement),
    what its metadata pass would otherwise find out."""
    remover._unused_imports = dict(unused)
