"""Which expressions can be evaluated, or dropped, without any effect beyond their value."""

from __future__ import annotations

import libcst as cst

from transforms.analysis.syntax import children

PURE_BUILTINS = frozenset({"len", "isinstance", "range", "zip", "enumerate", "tuple", "list", "dict", "set",
                           "min", "max", "abs", "bool", "int", "float", "str", "type", "getattr", "hasattr"})


def is_pure(node: cst.CSTNode, pure_methods: frozenset[str] = frozenset()) -> bool:
    """True when evaluating ``node`` has no effect beyond its value.

    Calls count as effects unless the callee is a pure builtin or a method
    named in ``pure_methods``; yields, awaits and walrus assignments do too.
    Operators and attribute reads are taken to be effect-free, as they are on
    the tensors, tuples and configs of model code.
    """
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Call):
            func = current.func
            if not ((isinstance(func, cst.Name) and func.value in PURE_BUILTINS)
                    or (isinstance(func, cst.Attribute) and func.attr.value in pure_methods)):
                return False
        elif isinstance(current, (cst.Yield, cst.Await, cst.NamedExpr)):
            return False
        pending.extend(children(current))
    return True
