"""Name analysis: which names code reads and binds, and what a module imports."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from transforms.analysis.syntax import code_of, dotted_name

_CONSTANT_NAMES = frozenset({"None", "True", "False"})


def names_read(node: cst.CSTNode) -> set[str]:
    """Every name an expression or statement may read (conservative: a superset)."""
    reader = _NameReader()
    node.visit(reader)
    return reader.names


class _NameReader(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        if node.value not in _CONSTANT_NAMES:
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
            self.names.add(code_of(node.name).split(".")[0])

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

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return False

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return False

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return False


def name_targets(targets: Iterable[cst.BaseExpression]) -> set[str] | None:
    """The names assigned when every target is a name or a tuple of names, else None."""
    names: set[str] = set()
    for target in targets:
        if isinstance(target, cst.Name):
            names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            inner = name_targets(element.value for element in target.elements)
            if inner is None:
                return None
            names |= inner
        else:
            return None
    return names


def module_imports(module: cst.Module) -> dict[str, tuple[str, str | None]]:
    """Top-level absolute imports of a module: local name -> (module, imported object or None).

    ``import a.b`` binds ``a`` to the package ``a``; an aliased ``import a.b as
    c`` is left out, as are relative and star imports.
    """
    imports: dict[str, tuple[str, str | None]] = {}
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative \
                    and not isinstance(small.names, cst.ImportStar):
                source = dotted_name(small.module) or ""
                for alias in small.names:
                    imports[alias.evaluated_alias or alias.evaluated_name] = (source, alias.evaluated_name)
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is None:
                        root = alias.evaluated_name.split(".")[0]
                        imports[root] = (root, None)
    return imports


def imports_module(module: cst.Module, name: str) -> bool:
    """Whether the module's top-level imports bind ``name`` to the package of that name."""
    return module_imports(module).get(name) == (name, None)
