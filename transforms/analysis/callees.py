"""Which function of the module a call runs, when the module itself defines it.

Resolved: ``f(...)`` of a module-level function, ``C(...)`` of a module-level
class (its ``__init__``), ``self.m(...)`` in a method of a class (``m`` looked
up along the class and its bases defined in the module, depth first) and
``C.m(...)``, and a call on a submodule or a layer-loop item, which runs the
``forward`` of the file class ``__init__`` builds there
(:mod:`transforms.analysis.submodule_calls`).  A lookup that reaches a base defined elsewhere, or a name the
module rebinds, resolves to nothing: the callee may be another function.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from transforms.analysis.scopes import ModuleIndex
from transforms.analysis.submodule_calls import SubmoduleCalls
from transforms.analysis.syntax import all_params

_STATIC = m.Decorator(decorator=m.Name("staticmethod"))
_CLASS = m.Decorator(decorator=m.Name("classmethod"))


@dataclass(frozen=True)
class Callee:
    function: cst.FunctionDef
    bound: int  # leading parameters the call does not pass (the instance or class): 0 or 1

    def parameters(self) -> list[cst.Param]:
        """The parameters the call's positional arguments fill, in order."""
        return [*self.function.params.posonly_params, *self.function.params.params][self.bound:]

    def arguments_filling(self, call: cst.Call, names: set[str]) -> set[int] | None:
        """Positions of ``call``'s arguments that fill a parameter in ``names``; None if a ``*`` argument may."""
        parameters = self.parameters()
        found: set[int] = set()
        positional = True
        for position, arg in enumerate(call.args):
            if arg.star == "*":
                if positional and any(p.name.value in names for p in parameters[position:]):
                    return None
                positional = False  # after a * the positions are unknown
            elif arg.star:
                continue
            elif arg.keyword is not None:
                if arg.keyword.value in names:
                    found.add(position)
            elif positional and position < len(parameters) and parameters[position].name.value in names:
                found.add(position)
        return found


def _targets(small: cst.Assign | cst.AnnAssign) -> set[str]:
    targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
    return {t.value for t in targets if isinstance(t, cst.Name)}


def _kind(function: cst.FunctionDef) -> str:
    if any(m.matches(d, _STATIC) for d in function.decorators):
        return "static"
    return "class" if any(m.matches(d, _CLASS) for d in function.decorators) else "plain"


class Callees:
    """Resolves calls of one module (original nodes of ``index``'s tree)."""

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        body = index.module.body
        definitions: dict[str, list[cst.CSTNode]] = {}
        for statement in body:
            if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
                definitions.setdefault(statement.name.value, []).append(statement)
        # A name bound once at the top level, by its def: anything else may rebind it.
        single = {name for name, nodes in definitions.items() if len(index.root.bindings.get(name, ())) == 1}
        self.classes = {n: d[0] for n, d in definitions.items() if n in single and isinstance(d[0], cst.ClassDef)}
        self.functions = {n: d[0] for n, d in definitions.items() if n in single and isinstance(d[0], cst.FunctionDef)}
        self.submodules = SubmoduleCalls(index)

    def resolve(self, call: cst.Call) -> Callee | None:
        submodule = self.submodules.submodule_class(call)
        if submodule is not None:
            forward = self.lookup(self.classes[submodule], "forward") if submodule in self.classes else None
            return Callee(forward, 1) if forward is not None and _kind(forward) == "plain" else None
        func = call.func
        if isinstance(func, cst.Name):
            if self.index.lookup(self.index.scope_of(func), func.value) is not self.index.root:
                return None
            if func.value in self.functions:
                return Callee(self.functions[func.value], 0)
            if func.value in self.classes:
                init = self.lookup(self.classes[func.value], "__init__")
                return Callee(init, 1) if init is not None and _kind(init) == "plain" else None
            return None
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return None
        name = func.value.value
        method = self._method_of(call)
        if method is not None and _kind(method[1]) == "plain":
            cls, function = method
            parameters = all_params(function.params)
            if parameters and parameters[0].name.value == name \
                    and self.index.lookup(self.index.scope_of(func.value), name) is self.index.scope_of(parameters[0].name):
                found = self.lookup(cls, func.attr.value)
                return Callee(found, int(_kind(found) != "static")) if found is not None else None
        if name in self.classes and self.index.lookup(self.index.scope_of(func.value), name) is self.index.root:
            found = self.lookup(self.classes[name], func.attr.value)
            return Callee(found, int(_kind(found) == "class")) if found is not None else None
        return None

    def _method_of(self, node: cst.CSTNode) -> tuple[cst.ClassDef, cst.FunctionDef] | None:
        """The innermost method (a def right in a class body) around ``node``, with its class."""
        for ancestor in self.index.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                block = self.index.parent(ancestor)
                owner = self.index.parent(block) if block is not None else None
                if isinstance(owner, cst.ClassDef):
                    return owner, ancestor
        return None

    def lookup(self, cls: cst.ClassDef, name: str, seen: frozenset[str] = frozenset()) -> cst.FunctionDef | None:
        """The def ``name`` resolves to on ``cls``; None when not found or when a base is defined elsewhere."""
        if cls.name.value in seen or not isinstance(cls.body, cst.IndentedBlock):
            return None
        for statement in cls.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement
            if isinstance(statement, cst.SimpleStatementLine) and any(
                    isinstance(small, (cst.Assign, cst.AnnAssign)) and name in _targets(small)
                    for small in statement.body):
                return None  # a class attribute, not a def
        for base in cls.bases:
            if not (isinstance(base.value, cst.Name) and base.value.value in self.classes) or base.keyword is not None:
                return None
            found = self.lookup(self.classes[base.value.value], name, seen | {cls.name.value})
            if found is not None:
                return found
        return None
