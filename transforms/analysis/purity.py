"""Which expressions can be evaluated, or dropped, without any effect beyond their value."""

from __future__ import annotations

import libcst as cst


PURE_BUILTINS = frozenset({"len", "isinstance", "range", "zip", "enumerate", "tuple", "list", "dict", "set",
                           "min", "max", "abs", "bool", "int", "float", "str", "type", "getattr", "hasattr"})


def is_pure(node: cst.CSTNode, pure_methods: frozenset[str] = frozenset()) -> bool:
    """True when evaluating ``node`` has no effect beyond its value.

    Calls count as effects unless the callee is a pure builtin or a method
    named in ``pure_methods``; yields, awaits and walrus assignments do too.
    Operators and attribute reads are taken to be effect-free, as they are on
    the tensors, tuples and configs of model code.
    """
    checker = _PurityChecker(pure_methods)
    node.visit(checker)
    return checker.pure


class _PurityChecker(cst.CSTVisitor):
    def __init__(self, pure_methods: frozenset[str]) -> None:
        self.pure = True
        self.pure_methods = pure_methods

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) and func.value in PURE_BUILTINS:
            return
        if isinstance(func, cst.Attribute) and func.attr.value in self.pure_methods:
            return
        self.pure = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.pure = False

    def visit_Await(self, node: cst.Await) -> None:
        self.pure = False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.pure = False


