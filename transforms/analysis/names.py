"""Name analysis: which names code reads and binds, and what a module imports."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst

from transforms.analysis.syntax import children, code_of, dotted_name

_CONSTANT_NAMES = frozenset({"None", "True", "False"})


def names_read(node: cst.CSTNode) -> set[str]:
    """Every name an expression or statement may read (conservative: a superset).

    Attribute names after a dot, keywords of arguments and plain assignment
    targets are not reads; everything else named is.  The walk reads the
    nodes' fields: libcst's visitors would rebuild every node they pass.
    """
    names: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Name):
            if current.value not in _CONSTANT_NAMES:
                names.add(current.value)
        elif isinstance(current, (cst.Attribute, cst.Arg)):
            pending.append(current.value)
        elif isinstance(current, cst.AssignTarget):
            if not isinstance(current.target, cst.Name):
                pending.append(current.target)  # x[i] = ... reads x and i
        else:
            pending.extend(children(current))
    return names


_NEW_SCOPES = (cst.Lambda, cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def bound_names(node: cst.CSTNode) -> set[str]:
    """Names a statement (or target) binds anywhere inside it, nested functions excluded."""
    names: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            names.add(current.name.value)
            continue
        if isinstance(current, _NEW_SCOPES):
            continue
        if isinstance(current, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.Del)):
            _add_targets(current.target, names)
        elif isinstance(current, cst.NamedExpr):
            _add_targets(current.target, names)
        elif isinstance(current, cst.AsName):
            _add_targets(current.name, names)
        elif isinstance(current, cst.ImportAlias) and current.asname is None:
            names.add(code_of(current.name).split(".")[0])
        pending.extend(children(current))
    return names


def names_outside(node: cst.CSTNode, excluded: set[int], names: Callable[[cst.CSTNode], set[str]]) -> set[str]:
    """``names`` (``names_read`` or ``bound_names``) of ``node`` outside the subtrees whose ids are ``excluded``."""
    found: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if id(current) in excluded:
            continue
        if _contains(current, excluded):
            pending.extend(children(current))
        else:
            found |= names(current)
    return found


def _contains(node: cst.CSTNode, excluded: set[int]) -> bool:
    pending = [node]
    while pending:
        current = pending.pop()
        if id(current) in excluded:
            return True
        pending.extend(children(current))
    return False


def _add_targets(target: cst.CSTNode, names: set[str]) -> None:
    if isinstance(target, cst.Name):
        names.add(target.value)
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            _add_targets(element.value, names)
    elif isinstance(target, cst.StarredElement):
        _add_targets(target.value, names)


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


def names_in_order(node: cst.CSTNode) -> list[cst.Name]:
    """The names read in ``node``, in source order (first occurrence)."""
    found: list[cst.Name] = []
    seen: set[str] = set()

    class Reads(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False

        def visit_Arg(self, arg: cst.Arg) -> bool:
            arg.value.visit(self)
            return False

        def visit_AssignTarget(self, target: cst.AssignTarget) -> bool:
            return False

        def visit_Name(self, name: cst.Name) -> None:
            if name.value not in seen and name.value not in ("True", "False", "None"):
                seen.add(name.value)
                found.append(name)

    node.visit(Reads())
    return found


def assigned_names(node: cst.CSTNode) -> list[cst.Name]:
    """Names bound by the assignments in ``node``."""
    found = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and isinstance(current.target, cst.Name):
            found.append(current.target)
        pending.extend(children(current))
    return found
