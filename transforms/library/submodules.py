"""Give a class a submodule built in ``__init__``: the rules ``dropout_module`` and ``hoist_modules`` share.

- *Module classes*: a class is an ``nn.Module`` when one of its bases, or of the
  bases of the file's classes it derives from, resolves to a qualified name in
  ``module_bases``.
- *The receiver* of a method is its first positional parameter, unless it is a
  static or class method.
- *What ``__init__`` settles*: an attribute of the receiver assigned by an
  unconditional top-level statement of ``__init__`` and rebound by no other
  method; ``__init__`` must not return early.  Only expressions built from
  literals and settled attributes (:meth:`ClassFamily.relocate`) may move to
  the end of ``__init__``: they mean the same there as where they were.
- *Fresh names*: ``preferred``, else ``stem``, ``stem_1``, ``stem_2``... ; taken
  are the names the class, its bases and its subclasses in the file define or
  use on an instance (they share one attribute namespace).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import count

import libcst as cst
import libcst.matchers as m

from transforms.analysis.literals import is_literal
from transforms.analysis.scopes import ModuleIndex

# The default module_bases of the transforms that add submodules: what an nn.Module derives from.
MODULE_BASES = ("torch.nn.Module", "torch.nn.modules.module.Module",
                "transformers.modeling_utils.PreTrainedModel")
_STATIC = m.Name("staticmethod") | m.Name("classmethod")


def receiver(function: cst.FunctionDef) -> str | None:
    """The name bound to the instance in a method; None in static and class methods."""
    if any(m.matches(d.decorator, _STATIC) for d in function.decorators):
        return None
    positional = [*function.params.posonly_params, *function.params.params]
    return positional[0].name.value if positional else None


def methods(node: cst.ClassDef) -> Iterator[tuple[int, cst.FunctionDef, str]]:
    """``(index in the class body, method, receiver)`` of each instance method."""
    for index, statement in enumerate(node.body.body):
        if isinstance(statement, cst.FunctionDef) and (name := receiver(statement)) is not None:
            yield index, statement, name


def rebound(nodes: Iterable[cst.CSTNode], owner: str) -> set[str]:
    """Attributes of ``owner`` that assignments among ``nodes`` (and below them) rebind."""
    names: set[str] = set()
    for node in nodes:
        for found in m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign()):
            if isinstance(found, cst.AnnAssign) and found.value is None:
                continue
            targets = [found.target]  # type: ignore[attr-defined]  # the three matched kinds have a target
            while targets:
                target = targets.pop()
                if isinstance(target, (cst.Tuple, cst.List)):
                    targets.extend(element.value for element in target.elements)
                elif m.matches(target, m.Attribute(value=m.Name(owner))):
                    names.add(target.attr.value)
    return names


def fresh_names(preferred: str, stem: str) -> Iterator[str]:
    """The one naming rule: ``preferred``, then ``stem``, ``stem_1``, ``stem_2``..."""
    yield preferred
    if stem != preferred:
        yield stem
    yield from (f"{stem}_{index}" for index in count(1))


@dataclass
class InitSite:
    """Where a class's ``__init__`` can take one more line, and what that line can rely on."""

    index: int  # of __init__ among the class body's statements
    function: cst.FunctionDef
    receiver: str
    settled: frozenset[str]  # attributes whose value at the end of __init__ is the one methods see


class ClassFamily:
    """The file's top-level classes: which are modules, and how to add a submodule to one."""

    def __init__(self, index: ModuleIndex, module_bases: Iterable[str]) -> None:
        self.index = index
        self.module_bases = frozenset(module_bases)
        self.classes = {s.name.value: s for s in index.module.body if isinstance(s, cst.ClassDef)}
        self._names: dict[int, set[str]] = {}

    def bases(self, node: cst.ClassDef) -> set[str]:
        return set().union(*(self.index.qualified_names(base.value) for base in node.bases))

    def lineage(self, node: cst.ClassDef) -> list[cst.ClassDef]:
        """The classes of this file that ``node`` derives from, nearest first."""
        found: list[cst.ClassDef] = []
        pending = list(self.bases(node))
        while pending:
            base = self.classes.get(pending.pop(0))
            if base is not None and base is not node and base not in found:
                found.append(base)
                pending.extend(self.bases(base))
        return found

    def is_module(self, node: cst.ClassDef) -> bool:
        return any(self.bases(c) & self.module_bases for c in [node, *self.lineage(node)])

    def init_site(self, node: cst.ClassDef) -> InitSite | str:
        """Where and how ``node``'s ``__init__`` can create a submodule, or why it cannot."""
        found = [(index, method, name) for index, method, name in methods(node) if method.name.value == "__init__"]
        if not found:
            return "it has no __init__"
        index, init, name = found[-1]
        if not isinstance(init.body, cst.IndentedBlock):
            return "its __init__ is a one-line body"
        if m.findall(init, m.Return()):
            return "its __init__ may return before its end"
        reassigned = set().union(*(rebound([method], r) for _, method, r in methods(node) if method is not init))
        # Only unconditional top-level assignments are sure to have run when the appended line does.
        top_level = [s for s in init.body.body if isinstance(s, cst.SimpleStatementLine)]
        return InitSite(index, init, name, frozenset(rebound(top_level, name) - reassigned))

    def relocate(self, expression: cst.BaseExpression, site: InitSite, owner: str) -> cst.BaseExpression | None:
        """``expression`` (in a method whose receiver is ``owner``) as the end of ``__init__`` writes it.

        None when its value could differ there.
        """
        if is_literal(expression):
            return expression
        if isinstance(expression, cst.UnaryOperation):
            operand = self.relocate(expression.expression, site, owner)
            return None if operand is None else expression.with_changes(expression=operand)
        if isinstance(expression, cst.BinaryOperation):
            left = self.relocate(expression.left, site, owner)
            right = self.relocate(expression.right, site, owner)
            return None if left is None or right is None else expression.with_changes(left=left, right=right)
        if not isinstance(expression, cst.Attribute):
            return None
        if m.matches(expression.value, m.Name(owner)):
            if expression.attr.value not in site.settled:
                return None
            return expression.with_changes(value=cst.Name(site.receiver))
        value = self.relocate(expression.value, site, owner)
        return None if value is None else expression.with_changes(value=value)

    def fresh_attribute(self, node: cst.ClassDef, preferred: str, stem: str,
                        others: Iterable[cst.ClassDef] = ()) -> str:
        """A new instance attribute name for ``node`` and ``others`` (reserved from now on).

        ``others``: classes that get the attribute under the same name, because
        code shared by all of them reads it.
        """
        owners = [node, *others]
        family = [c for owner in owners
                  for c in [owner, *self.lineage(owner),
                            *(c for c in self.classes.values() if owner in self.lineage(c))]]
        taken = set().union(*(self._used_names(c) for c in family))
        name = next(candidate for candidate in fresh_names(preferred, stem) if candidate not in taken)
        for owner in owners:
            self._used_names(owner).add(name)
        return name

    def _used_names(self, node: cst.ClassDef) -> set[str]:
        """Names a new attribute of ``node``'s instances could clash with."""
        if id(node) not in self._names:
            names = self._names[id(node)] = set()
            for statement in node.body.body:
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    names.add(statement.name.value)
                elif isinstance(statement, cst.SimpleStatementLine):
                    for assignment in m.findall(statement, m.AssignTarget() | m.AnnAssign()):
                        target = assignment.target  # type: ignore[attr-defined]  # both kinds have one
                        names.update(n.value for n in m.findall(target, m.Name()) if isinstance(n, cst.Name))
            for _, method, owner in methods(node):
                names.update(a.attr.value for a in m.findall(method, m.Attribute(value=m.Name(owner)))
                             if isinstance(a, cst.Attribute))
        return self._names[id(node)]


def append_to_init(node: cst.ClassDef, site: InitSite, lines: list[cst.SimpleStatementLine]) -> cst.ClassDef:
    """``node`` (the updated class) with ``lines`` at the end of the ``__init__`` that ``site`` describes."""
    body = list(node.body.body)
    init = body[site.index]
    assert isinstance(init, cst.FunctionDef) and isinstance(init.body, cst.IndentedBlock)
    body[site.index] = init.with_changes(body=init.body.with_changes(body=[*init.body.body, *lines]))
    return node.with_changes(body=node.body.with_changes(body=body))
