"""Expression-level constant folding shared by transforms (not a transform itself).

Constants are the literal atoms a recipe can name: ``None``, ``True``, ``False``,
numbers and strings.  Folding only ever replaces a node by one of its own
operands or by a constant atom, so the result binds at least as tightly as
what it replaces and never needs new parentheses.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

_EMPTY = cst.Module(body=[])
_PURE_BUILTINS = frozenset({"len", "isinstance", "range", "zip", "enumerate", "tuple", "list", "dict", "set",
                            "min", "max", "abs", "bool", "int", "float", "str", "type", "getattr", "hasattr"})
_NO_VALUE = object()


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def literal_value(node: cst.BaseExpression) -> object:
    """The Python value of a constant atom, or ``_NO_VALUE``."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString, cst.UnaryOperation)):
        try:
            return ast.literal_eval(code(node).strip())
        except (ValueError, SyntaxError):
            return _NO_VALUE
    return _NO_VALUE


def is_constant(node: cst.BaseExpression) -> bool:
    return literal_value(node) is not _NO_VALUE


def constant(value: object) -> cst.BaseExpression:
    return cst.parse_expression(repr(value))


def _with_parens_of(replacement: cst.BaseExpression, original: cst.BaseExpression) -> cst.BaseExpression:
    if original.lpar and not replacement.lpar:
        return replacement.with_changes(lpar=original.lpar, rpar=original.rpar)
    return replacement


def module_imports(module: cst.Module) -> dict[str, tuple[str, str | None]]:
    """Top-level imported names of a module: local name -> (module, object or None)."""
    imports: dict[str, tuple[str, str | None]] = {}
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative \
                    and not isinstance(small.names, cst.ImportStar):
                source = module.code_for_node(small.module)
                for alias in small.names:
                    name = module.code_for_node(alias.name)
                    local = alias.asname.name.value if alias.asname else name
                    imports[local] = (source, name)
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = module.code_for_node(alias.name)
                    if alias.asname is None:
                        imports[dotted.split(".")[0]] = (dotted.split(".")[0], None)
    return imports


def names_read(node: cst.CSTNode) -> set[str]:
    """Every name an expression or statement may read (conservative: a superset)."""
    reader = _NameReader()
    node.visit(reader)
    return reader.names


class _NameReader(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        if node.value not in ("None", "True", "False"):
            self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        if not isinstance(node.target, cst.Name):
            node.target.visit(self)  # x[i] = ... reads x and i
        return False


def bound_names(node: cst.CSTNode) -> set[str]:
    """Names a statement (or target) binds anywhere inside it, nested functions excluded."""
    collector = _BindingCollector()
    node.visit(collector)
    return collector.names


class _BindingCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.depth = 0

    def _targets(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self.names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._targets(element.value)
        elif isinstance(target, cst.StarredElement):
            self._targets(target.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._targets(node.name)

    def visit_Del(self, node: cst.Del) -> None:
        self._targets(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._targets(node.target)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is None:
            self.names.add(cst.Module([]).code_for_node(node.name).split(".")[0])

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return False

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp  # type: ignore[assignment]


def is_pure(node: cst.BaseExpression, pure_methods: frozenset[str] = frozenset()) -> bool:
    """True when evaluating ``node`` has no effect beyond its value (calls only to known-pure callees)."""
    checker = _PurityChecker(pure_methods)
    node.visit(checker)
    return checker.pure


class _PurityChecker(cst.CSTVisitor):
    def __init__(self, pure_methods: frozenset[str]) -> None:
        self.pure = True
        self.pure_methods = pure_methods

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) and func.value in _PURE_BUILTINS:
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


@dataclass(frozen=True)
class Known:
    """What is known about a name at one program point."""

    value: cst.BaseExpression | None  # the constant it holds, if any
    from_entry: bool  # the function's entry value (a removed parameter) may reach here


class ExpressionFolder(cst.CSTTransformer):
    """Substitute known constants for names, then fold what became constant.

    ``observed`` collects names whose entry value is read without being
    substituted, i.e. names that still need a binding at function entry.
    """

    def __init__(self, env: Mapping[str, Known]) -> None:
        super().__init__()
        self.env = env
        self.shadowed: list[set[str]] = []
        self.observed: set[str] = set()

    # -- names that are not reads of a variable ----------------------------
    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        return updated_node.with_changes(name=original_node.name)

    def _push_bound(self, node: cst.CSTNode, targets: list[cst.CSTNode]) -> None:
        bound: set[str] = set()
        for target in targets:
            bound |= names_read(target)
        self.shadowed.append(bound)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._push_bound(node, [p.name for p in node.params.params])

    def leave_Lambda(self, original_node: cst.Lambda, updated_node: cst.Lambda) -> cst.Lambda:
        self.shadowed.pop()
        return updated_node

    def _comp_targets(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        targets = []
        comp = getattr(node, "for_in", None)
        while comp is not None:
            targets.append(comp.target)
            comp = comp.inner_for_in
        return targets

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._push_bound(node, self._comp_targets(node))

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp  # type: ignore[assignment]

    def _leave_comp(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:
        self.shadowed.pop()
        return updated_node

    leave_ListComp = leave_SetComp = leave_GeneratorExp = leave_DictComp = _leave_comp  # type: ignore[assignment]

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
    def leave_Comparison(self, original_node: cst.Comparison,
                         updated_node: cst.Comparison) -> cst.BaseExpression:
        if len(updated_node.comparisons) != 1:
            return updated_node
        target = updated_node.comparisons[0]
        left, right = literal_value(updated_node.left), literal_value(target.comparator)
        if left is _NO_VALUE or right is _NO_VALUE:
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
            if value is not _NO_VALUE:
                return _with_parens_of(constant(not value), updated_node)
        return updated_node

    def leave_BooleanOperation(self, original_node: cst.BooleanOperation,
                               updated_node: cst.BooleanOperation) -> cst.BaseExpression:
        left = literal_value(updated_node.left)
        if left is _NO_VALUE:
            return updated_node
        is_and = isinstance(updated_node.operator, cst.And)
        # `a and b` is a if a is falsy else b; `a or b` is a if a is truthy else b.
        keep_left = (not left) if is_and else bool(left)
        chosen = updated_node.left if keep_left else updated_node.right
        return _with_parens_of(chosen, updated_node)

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        test = literal_value(simplify_condition(updated_node.test))
        if test is _NO_VALUE:
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
        return constant(not value) if value is not _NO_VALUE else node.with_changes(expression=inner)
    if not isinstance(node, cst.BooleanOperation):
        return node
    left = simplify_condition(node.left, pure_methods)
    right = simplify_condition(node.right, pure_methods)
    left_value, right_value = literal_value(left), literal_value(right)
    is_and = isinstance(node.operator, cst.And)
    if left_value is not _NO_VALUE:
        if is_and:
            return constant(False) if not left_value else _with_parens_of(right, node)
        return constant(True) if left_value else _with_parens_of(right, node)
    if right_value is not _NO_VALUE:
        if is_and and not right_value and is_pure(left, pure_methods):
            return constant(False)
        if not is_and and right_value and is_pure(left, pure_methods):
            return constant(True)
        if (is_and and right_value) or (not is_and and not right_value):
            return _with_parens_of(left, node)
    return node.with_changes(left=left, right=right)


def truth(node: cst.BaseExpression) -> bool | None:
    value = literal_value(node)
    return None if value is _NO_VALUE else bool(value)
