"""Scopes, qualified names and an index of a module, from one walk over its nodes' fields.

libcst's visitors rebuild every node they pass, and its ``ScopeProvider`` costs several parses
per transform that asks.  :class:`ModuleIndex` reads the nodes' dataclass fields instead and
records each node's parent and scope, and each scope's bindings and reads.  It answers what the
transforms ask: the qualified names an expression may refer to (as ``QualifiedNameProvider``
would, relative imports made absolute), where a local is bound and read, the nodes of a kind.

Scoping follows Python: function bodies, lambdas and comprehensions open scopes; a class body
is a scope its methods do not see; ``global``/``nonlocal`` send a name outward; defaults,
decorators, bases and a comprehension's first iterable belong to the enclosing scope.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import libcst as cst
from libcst.helpers import get_absolute_module_from_package

from transforms.analysis.syntax import all_params, children, dotted_name
from transforms.analysis.syntax import field_names as _fields

_N = TypeVar("_N", bound=cst.CSTNode)
_BUILTINS = frozenset(dir(builtins))
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
_IS_STATEMENT: dict[type, bool] = {}
@dataclasses.dataclass(eq=False)
class Scope:
    node: cst.CSTNode  # the Module, FunctionDef, Lambda, ClassDef or comprehension
    parent: Scope | None
    bindings: dict[str, list[cst.CSTNode]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    imports: dict[str, str] = dataclasses.field(default_factory=dict)  # bound name -> imported qualified name
    reads: dict[str, list[cst.Name]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    globals: set[str] = dataclasses.field(default_factory=set)  # declared global
    nonlocals: set[str] = dataclasses.field(default_factory=set)  # declared nonlocal

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, cst.ClassDef)


class ModuleIndex:
    """What one walk over ``module`` learns; valid while that exact tree is the one transformed."""

    def __init__(self, module: cst.Module, package: str = "") -> None:
        self.module = module
        self.package = package
        self.parents: dict[int, cst.CSTNode] = {}
        self.scopes: dict[int, Scope] = {}  # id(node) -> the scope the node is evaluated in
        self.by_type: dict[type, list[cst.CSTNode]] = defaultdict(list)
        self.order: dict[int, int] = {}  # id(statement) -> its position in source order
        self._labels: set[int] = set()  # names that refer to nothing: attributes after the dot, keywords
        self.root = Scope(module, None)
        self.all_scopes = [self.root]
        self._walk(module, None, self.root, store=False)

    # -- queries -----------------------------------------------------------------------------------------
    def nodes(self, kind: type[_N]) -> list[_N]:
        """Every node of exactly type ``kind``, in walk order."""
        return self.by_type.get(kind, [])  # type: ignore[return-value]  # by_type groups nodes by type

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The node's parents, innermost first."""
        parent = self.parents.get(id(node))
        while parent is not None:
            yield parent
            parent = self.parents.get(id(parent))

    def enclosing(self, node: cst.CSTNode, kind: type[_N]) -> _N | None:
        return next((a for a in self.ancestors(node) if isinstance(a, kind)), None)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        return self.scopes[id(node)]

    def statement_position(self, node: cst.CSTNode) -> int:
        """The source-order position of the statement holding ``node``."""
        for candidate in (node, *self.ancestors(node)):
            if id(candidate) in self.order:
                return self.order[id(candidate)]
        return -1

    def lookup(self, scope: Scope, name: str) -> Scope | None:
        """The scope whose binding of ``name`` code in ``scope`` sees, or None (a builtin or unbound)."""
        current: Scope | None = scope
        while current is not None:
            if name in current.globals:
                return self.root if name in self.root.bindings else None
            if name in current.nonlocals:
                current = current.parent
                continue
            if name in current.bindings and (current is scope or not current.is_class):
                return current
            current = current.parent
        return None

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """The qualified names ``node`` (a name, an attribute chain or a call of one) may refer to."""
        if isinstance(node, cst.Call):
            node = node.func
        dotted = dotted_name(node)
        if dotted is None or id(node) not in self.scopes or id(node) in self._labels:
            return set()
        return self.qualified_names_in(self.scope_of(node), dotted)

    def qualified_names_in(self, scope: Scope, dotted: str) -> set[str]:
        """The qualified names a dotted name written in ``scope`` may refer to."""
        root, _, rest = dotted.partition(".")
        tail = f".{rest}" if rest else ""
        found = self.lookup(scope, root)
        if found is None:
            return {f"builtins.{dotted}"} if root in _BUILTINS else set()
        names = set()
        for binding in found.bindings[root]:
            if isinstance(binding, (cst.Import, cst.ImportFrom)):
                names.add(self.absolute_module(found.imports[root]) + tail)
            else:
                names.add(self._prefix(found) + dotted)
        return names

    def local_uses(self, name: cst.Name) -> tuple[list[cst.CSTNode], list[cst.Name]]:
        """Where the variable ``name`` (as bound or read at that node) is bound, and every read of it."""
        scope = self.lookup(self.scope_of(name), name.value)
        if scope is None:
            return [], []
        reads = [read for inner in self._scopes_seeing(scope, name.value) for read in inner.reads[name.value]]
        return list(scope.bindings[name.value]), reads

    # -- the walk ----------------------------------------------------------------------------------------
    def _scopes_seeing(self, scope: Scope, name: str) -> Iterator[Scope]:
        return (inner for inner in self.all_scopes if self.lookup(inner, name) is scope)

    def absolute_module(self, name: str) -> str:
        """A module name as an import in this module writes it (``...modeling_utils``), made absolute."""
        dots = len(name) - len(name.lstrip("."))
        if not dots:
            return name
        return get_absolute_module_from_package(self.package, name[dots:] or None, dots) or name

    def _prefix(self, scope: Scope) -> str:
        parts = []
        current: Scope | None = scope
        while current is not None and current.parent is not None:
            node = current.node
            label = node.name.value if isinstance(node, (cst.FunctionDef, cst.ClassDef)) else "<lambda>"
            parts.append(label + (".<locals>" if not current.is_class else ""))
            current = current.parent
        return "".join(f"{part}." for part in reversed(parts))

    def _record(self, node: cst.CSTNode, parent: cst.CSTNode | None, scope: Scope) -> None:
        if parent is not None:
            self.parents[id(node)] = parent
        self.scopes[id(node)] = scope
        kind = type(node)
        self.by_type[kind].append(node)
        statement = _IS_STATEMENT.get(kind)
        if statement is None:
            statement = _IS_STATEMENT[kind] = isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        if statement:
            self.order[id(node)] = len(self.order)

    def _walk(self, node: cst.CSTNode, parent: cst.CSTNode | None, scope: Scope, store: bool) -> None:
        self._record(node, parent, scope)
        handler = _HANDLERS.get(type(node))
        if handler is not None:
            handler(self, node, scope, store)
            return
        if isinstance(node, cst.Name):
            if store:
                scope.bindings[node.value].append(node)
            elif node.value not in ("None", "True", "False"):
                scope.reads[node.value].append(node)
            return
        inner_store = store and isinstance(node, (cst.Tuple, cst.List, cst.StarredElement, cst.Element))
        for child in children(node):
            self._walk(child, node, scope, inner_store)

    def _each(self, node: cst.CSTNode, names: Iterable[str], scope: Scope, store: bool = False) -> None:
        for name in names:
            value = getattr(node, name, None)
            if isinstance(value, cst.CSTNode):
                self._walk(value, node, scope, store)
            elif isinstance(value, (tuple, list)):
                for item in value:
                    self._walk(item, node, scope, store)

    def _opened(self, node: cst.CSTNode, scope: Scope) -> Scope:
        inner = Scope(node, scope)
        self.all_scopes.append(inner)
        return inner

    def _function(self, node: cst.FunctionDef | cst.Lambda, scope: Scope, store: bool) -> None:
        if isinstance(node, cst.FunctionDef):
            scope.bindings[node.name.value].append(node)
            self._record(node.name, node, scope)
            self._each(node, ("decorators", "returns"), scope)
        inner = self._opened(node, scope)
        self._record(node.params, node, scope)
        for param in all_params(node.params, starred=True):
            self._record(param, node.params, scope)
            self._record(param.name, param, inner)
            inner.bindings[param.name.value].append(param)
            self._each(param, ("annotation", "default"), scope)
        self._each(node, ("body",), inner)

    def _class(self, node: cst.ClassDef, scope: Scope, store: bool) -> None:
        scope.bindings[node.name.value].append(node)
        self._record(node.name, node, scope)
        self._each(node, ("decorators", "bases", "keywords"), scope)
        self._each(node, ("body",), self._opened(node, scope))

    def _comprehension(self, node: cst.CSTNode, scope: Scope, store: bool) -> None:
        inner = self._opened(node, scope)
        comp: cst.CompFor | None = node.for_in  # type: ignore[attr-defined]  # every comprehension has one
        holder = node
        while comp is not None:
            self._record(comp, holder, inner)
            self._walk(comp.target, comp, inner, True)
            self._walk(comp.iter, comp, scope if holder is node else inner, False)
            for condition in comp.ifs:
                self._walk(condition, comp, inner, False)
            holder, comp = comp, comp.inner_for_in
        self._each(node, ("elt", "key", "value"), inner)

    def _import(self, node: cst.Import | cst.ImportFrom, scope: Scope, store: bool) -> None:
        if isinstance(node, cst.ImportFrom) and isinstance(node.names, cst.ImportStar):
            return
        module = ""
        if isinstance(node, cst.ImportFrom):
            module = "." * len(node.relative) + ((dotted_name(node.module) or "") if node.module else "")
        for alias in node.names:  # type: ignore[union-attr]  # ImportStar returned above
            name = alias.evaluated_name
            qualified = f"{module}.{name}" if module and not module.endswith(".") else module + name
            bound = alias.evaluated_alias
            if bound is None and isinstance(node, cst.Import):
                bound, qualified = name.split(".")[0], name.split(".")[0]
            bound = bound or name
            scope.bindings[bound].append(node)
            scope.imports[bound] = qualified

    def _declaration(self, node: cst.Global | cst.Nonlocal, scope: Scope, store: bool) -> None:
        names = {item.name.value for item in node.names}
        (scope.globals if isinstance(node, cst.Global) else scope.nonlocals).update(names)

    def _target(self, node: cst.CSTNode, scope: Scope, store: bool) -> None:
        """Assignments, ``for`` and ``del``: the ``target`` field binds, the rest is read."""
        for name in _fields(node):
            value = getattr(node, name)
            binds = name == "target"
            if binds and isinstance(node, cst.AugAssign) and isinstance(value, cst.Name):
                self._walk(value, node, scope, False)  # read, then bound again
                scope.bindings[value.value].append(value)
            elif isinstance(value, cst.CSTNode):
                self._walk(value, node, scope, binds)
            elif isinstance(value, (tuple, list)):
                for item in value:
                    self._walk(item, node, scope, False)

    def _as_name(self, node: cst.AsName, scope: Scope, store: bool) -> None:
        self._walk(node.name, node, scope, True)

    def _walrus(self, node: cst.NamedExpr, scope: Scope, store: bool) -> None:
        target_scope = scope
        while isinstance(target_scope.node, _COMPREHENSIONS) and target_scope.parent is not None:
            target_scope = target_scope.parent
        self._walk(node.target, node, target_scope, True)
        self._walk(node.value, node, scope, False)

    def _attribute(self, node: cst.Attribute, scope: Scope, store: bool) -> None:
        self._walk(node.value, node, scope, False)
        self._record(node.attr, node, scope)
        self._labels.add(id(node.attr))

    def _arg(self, node: cst.Arg, scope: Scope, store: bool) -> None:
        self._walk(node.value, node, scope, False)
        if node.keyword is not None:
            self._record(node.keyword, node, scope)
            self._labels.add(id(node.keyword))

    def _subscript(self, node: cst.Subscript, scope: Scope, store: bool) -> None:
        self._each(node, ("value", "slice"), scope)


_HANDLERS: dict[type, Callable[[ModuleIndex, Any, Scope, bool], None]] = {
    cst.FunctionDef: ModuleIndex._function, cst.Lambda: ModuleIndex._function, cst.ClassDef: ModuleIndex._class,
    **{kind: ModuleIndex._comprehension for kind in _COMPREHENSIONS},
    cst.Import: ModuleIndex._import, cst.ImportFrom: ModuleIndex._import,
    cst.Global: ModuleIndex._declaration, cst.Nonlocal: ModuleIndex._declaration,
    cst.AssignTarget: ModuleIndex._target, cst.AnnAssign: ModuleIndex._target, cst.AugAssign: ModuleIndex._target,
    cst.For: ModuleIndex._target, cst.Del: ModuleIndex._target,
    cst.AsName: ModuleIndex._as_name, cst.NamedExpr: ModuleIndex._walrus,
    cst.Attribute: ModuleIndex._attribute, cst.Arg: ModuleIndex._arg, cst.Subscript: ModuleIndex._subscript,
}
