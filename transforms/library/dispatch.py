"""A transformer's ``visit_*`` / ``leave_*`` hooks, looked up once per class and node type instead of per node.

libcst finds a transformer's hook for every node it enters by formatting its name and calling
``getattr`` (four lookups a node: ``visit_X``, ``leave_X`` and the per-attribute pair for every
field), and libcst's base classes define a no-op stub for every name, so every lookup succeeds
and every stub is called.  On a 1,500-line module that is millions of lookups per pass: a third
of a conversion.  :class:`FastDispatch` answers the same questions from a table per class, built
on first use, where a libcst stub (marked ``_is_no_op``) is recorded as "no hook" and not called.

The result is the same calls in the same order, minus calls of libcst's no-op stubs: a
``visit_X`` stub returns None (visit the children), a ``leave_X`` stub returns the updated node,
an attribute stub does nothing.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from transforms.library.libcst_internals import is_no_op_stub

_TABLES: dict[type, dict[Any, str | None]] = {}


def _lookup(cls: type, key: Any) -> str | None:
    """The name of ``cls``'s hook for ``key``, None where there is only a libcst stub.

    The name, not the function: a hook replaced on the class later (a test patching a
    transform) is still the one called.
    """
    table = _TABLES.get(cls)
    if table is None:
        table = _TABLES[cls] = {}
    if key not in table:
        kind, node_type, attribute = key
        name = f"{kind}_{node_type.__name__}" + (f"_{attribute}" if attribute else "")
        function = getattr(cls, name, None)
        table[key] = None if function is None or is_no_op_stub(function) else name
    return table[key]


class FastDispatch:
    """Mix in before ``cst.CSTTransformer`` (or a subclass of it): the same hooks, found by table.

    A class whose hooks are set on the instance, or that uses libcst's matcher decorators, must
    not use it (:class:`transforms.library.base.Transform` checks the latter per instance).
    """

    def _dispatch_visit(self, node: cst.CSTNode) -> bool:
        hook = _lookup(type(self), ("visit", type(node), None))
        return hook is None or getattr(self, hook)(node) is not False

    def _dispatch_leave(self, original_node: Any, updated_node: Any) -> Any:
        hook = _lookup(type(self), ("leave", type(original_node), None))
        return updated_node if hook is None else getattr(self, hook)(original_node, updated_node)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self._dispatch_visit(node)

    def on_leave(self, original_node: Any, updated_node: Any) -> Any:
        return self._dispatch_leave(original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        hook = _lookup(type(self), ("visit", type(node), attribute))
        if hook is not None:
            getattr(self, hook)(node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        hook = _lookup(type(self), ("leave", type(original_node), attribute))
        if hook is not None:
            getattr(self, hook)(original_node)
