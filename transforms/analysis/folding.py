"""Expression folding: substitute known constants for names and fold what became constant.

Folding only ever replaces a node by one of its own operands or by a constant
atom, so the result binds at least as tightly as what it replaces and never
needs new parentheses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
from libcst import CSTNodeT

from transforms.analysis.literals import NO_VALUE, constant, literal_value
from transforms.analysis.names import names_read
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import dotted_name

_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def _scope_targets(node: cst.CSTNode) -> list[cst.CSTNode]:
    """What a lambda or comprehension binds for its own body."""
    if isinstance(node, cst.Lambda):
        return [p.name for p in node.params.params]
    targets: list[cst.CSTNode] = []
    comp = getattr(node, "for_in", None)
    while comp is not None:
        targets.append(comp.target)
        comp = comp.inner_for_in
    return targets


def _with_parens_of(replacement: cst.BaseExpression, original: cst.BaseExpression) -> cst.BaseExpression:
    if original.lpar and not replacement.lpar:
        return replacement.with_changes(lpar=original.lpar, rpar=original.rpar)
    return replacement


@dataclass(frozen=True)
class Known:
    """What is known about a name at one program point."""

    value: cst.BaseExpression | None  # the constant it holds, if any
    from_entry: bool  # the function's entry value (a removed parameter) may reach here


class ExpressionFolder(cst.CSTTransformer):
    """Substitute known constants for names, then fold what became constant.

    ``observed`` collects names whose entry value is read without being
    substituted, i.e. names that still need a binding at function entry.
    ``classes`` are the dotted names known to be classes no constant is an
    instance of (classes of third-party modules): ``isinstance(None, C)`` folds
    to ``False`` for them.
    """

    def __init__(self, env: Mapping[str, Known], classes: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.env = env
        self.classes = classes
        self.shadowed: list[set[str]] = []
        self.observed: set[str] = set()

    # -- names that are not reads of a variable ----------------------------
    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        value = updated_node.value
        if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary)) and not value.lpar:
            # A number substituted as a receiver: `0.real` would not parse.
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node.with_changes(value=value, attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        return updated_node.with_changes(name=original_node.name)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, _SCOPES):
            self.shadowed.append(set().union(*(names_read(target) for target in _scope_targets(node))))
        return super().on_visit(node)

    def on_leave(self, original_node: CSTNodeT,
                 updated_node: CSTNodeT) -> CSTNodeT | cst.RemovalSentinel | cst.FlattenSentinel[CSTNodeT]:
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, _SCOPES):
            self.shadowed.pop()
        return result

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        name = original_node.value
        known = self.env.get(name)
        if known is None or any(name in bound for bound in self.shadowed):
            return updated_node
        if known.value is not None:
            return _with_parens_of(known.value.deep_clone(), updated_node)
        if known.from_entry:
            self.observed.add(name)
        return updated_node

    # -- folding -----------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        """``isinstance(<constant>, C)`` is False when every class C names is one of ``classes``."""
        args = updated_node.args
        if not (isinstance(updated_node.func, cst.Name) and updated_node.func.value == "isinstance"
                and len(args) == 2 and not any(a.star or a.keyword for a in args)):
            return updated_node
        if literal_value(args[0].value) is NO_VALUE:
            return updated_node
        kinds = args[1].value
        names = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        if names and all(dotted_name(name) in self.classes for name in names):
            return _with_parens_of(constant(False), updated_node)
        return updated_node

    def leave_Comparison(self, original_node: cst.Comparison,
                         updated_node: cst.Comparison) -> cst.BaseExpression:
        if len(updated_node.comparisons) != 1:
            return updated_node
        target = updated_node.comparisons[0]
        left, right = literal_value(updated_node.left), literal_value(target.comparator)
        if left is NO_VALUE or right is NO_VALUE:
            return updated_node
        singletons = (None, True, False)
        operator = target.operator
        if isinstance(operator, (cst.Is, cst.IsNot)):
            if not (any(left is s for s in singletons) and any(right is s for s in singletons)):
                return updated_node
            result = (left is right) if isinstance(operator, cst.Is) else (left is not right)
        elif isinstance(operator, cst.Equal):
            result = left == right
        elif isinstance(operator, cst.NotEqual):
            result = left != right
        else:
            return updated_node
        return _with_parens_of(constant(result), updated_node)

    def leave_UnaryOperation(self, original_node: cst.UnaryOperation,
                             updated_node: cst.UnaryOperation) -> cst.BaseExpression:
        if isinstance(updated_node.operator, cst.Not):
            value = literal_value(updated_node.expression)
            if value is not NO_VALUE:
                return _with_parens_of(constant(not value), updated_node)
        return updated_node

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation,
                               updated_node: cst.BooleanOperation) -> cst.BaseExpression:
        left = literal_value(updated_node.left)
        if left is NO_VALUE:
            return updated_node
        is_and = isinstance(updated_node.operator, cst.And)
        # `a and b` is a if a is falsy else b; `a or b` is a if a is truthy else b.
        keep_left = (not left) if is_and else bool(left)
        chosen = updated_node.left if keep_left else updated_node.right
        return _with_parens_of(chosen, updated_node)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        test = literal_value(simplify_condition(updated_node.test))
        if test is NO_VALUE:
            return updated_node
        return _with_parens_of(updated_node.body if test else updated_node.orelse, updated_node)


def simplify_condition(node: cst.BaseExpression, pure_methods: frozenset[str] = frozenset()) -> cst.BaseExpression:
    """Fold an expression whose value is only used for its truth (an if/while/assert test).

    There ``a and False`` is falsy and ``a or True`` truthy whatever ``a`` is,
    provided evaluating ``a`` has no effect that dropping it would lose.
    """
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
        inner = simplify_condition(node.expression, pure_methods)
        value = literal_value(inner)
        return constant(not value) if value is not NO_VALUE else node.with_changes(expression=inner)
    if not isinstance(node, cst.BooleanOperation):
        return node
    left = simplify_condition(node.left, pure_methods)
    right = simplify_condition(node.right, pure_methods)
    left_value, right_value = literal_value(left), literal_value(right)
    is_and = isinstance(node.operator, cst.And)
    if left_value is not NO_VALUE:
        if is_and:
            return constant(False) if not left_value else _with_parens_of(right, node)
        return constant(True) if left_value else _with_parens_of(right, node)
    if right_value is not NO_VALUE:
        if is_and and not right_value and is_pure(left, pure_methods):
            return constant(False)
        if not is_and and right_value and is_pure(left, pure_methods):
            return constant(True)
        if (is_and and right_value) or (not is_and and not right_value):
            return _with_parens_of(left, node)
    return node.with_changes(left=left, right=right)
