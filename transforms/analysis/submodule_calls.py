"""Which class of this file a submodule call runs: ``self.attention(...)``, ``layer_module(...)`` in a layer loop.

Model code calls its submodules positionally (BERT's ``self.self(hidden_states, attention_mask,
head_mask, ...)``), so a rewrite that changes a ``forward``'s parameters must find the calls that
run it.  The class of a submodule is read off ``__init__`` the way model code writes it:

* ``self.attr = K(...)``, or ``K(...) if flag else None`` (a submodule that may be absent);
* ``self.attr = nn.ModuleList([K(...) for _ in range(n)])`` (or a list of ``K(...)`` calls), whose
  items a loop in another method calls: ``for x in self.attr`` or ``for i, x in enumerate(self.attr)``.

``K`` must be a top-level class of the file.  The answer is None unless it is certain: every
assignment of the attribute in the class and the classes it derives from (in the file) names the
same class, and no method other than ``__init__`` rebinds the attribute.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
import libcst.matchers as m

from transforms.analysis.scopes import ModuleIndex
from transforms.library.submodules import ClassFamily, methods, receiver

_MODULE_LIST = ("torch.nn.ModuleList", "torch.nn.modules.container.ModuleList")


class SubmoduleCalls:
    """Answers "which file class does this submodule call run?" for one module index."""

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self.family = ClassFamily(index, ())
        self._assigned: dict[tuple[int, str], tuple[str | None, bool] | None] = {}
        self._assignment_cache: dict[int, list[cst.CSTNode]] = {}

    def owner(self, node: cst.CSTNode) -> tuple[cst.ClassDef, cst.FunctionDef, str] | None:
        """The class, method and receiver name of the method holding ``node`` (a top-level class's)."""
        method = self.index.enclosing(node, cst.FunctionDef)
        if method is None:
            return None
        block = self.index.parent(method)
        cls = self.index.parent(block) if isinstance(block, cst.IndentedBlock) else None
        name = receiver(method)
        if not isinstance(cls, cst.ClassDef) or name is None or cls.name.value not in self.family.classes:
            return None
        return cls, method, name

    def submodule_class(self, call: cst.Call) -> str | None:
        """The file class whose instance ``call`` calls, when the call is on a submodule or a loop item."""
        found = self.owner(call)
        if found is None:
            return None
        cls, method, owner = found
        func = call.func
        if isinstance(func, cst.Attribute) and m.matches(func.value, m.Name(owner)):
            assigned = self._attribute(cls, func.attr.value)
            return assigned[0] if assigned is not None and not assigned[1] else None
        if isinstance(func, cst.Name):
            attribute = self._loop_source(func, method, owner)
            if attribute is None:
                return None
            assigned = self._attribute(cls, attribute)
            return assigned[0] if assigned is not None and assigned[1] else None
        return None

    def method_owner(self, cls: str, method: str) -> str | None:
        """The class (``cls`` or a file class it derives from, nearest first) defining ``method``."""
        node = self.family.classes.get(cls)
        if node is None:
            return None
        for candidate in (node, *self.family.lineage(node)):
            if any(f.name.value == method for _, f, _ in methods(candidate)):
                return candidate.name.value
        return None

    # -- what __init__ assigns ----------------------------------------------------------------------------
    def _attribute(self, cls: cst.ClassDef, attribute: str) -> tuple[str | None, bool] | None:
        """``(class, is a list of them)`` assigned to ``self.<attribute>``, None if not one certain class."""
        key = (id(cls), attribute)
        if key not in self._assigned:
            self._assigned[key] = self._resolve(cls, attribute)
        return self._assigned[key]

    def _resolve(self, cls: cst.ClassDef, attribute: str) -> tuple[str | None, bool] | None:
        answers: set[tuple[str | None, bool]] = set()
        for node in (cls, *self.family.lineage(cls)):
            for _, method, owner in methods(node):
                for value in _assignments(self._assignment_nodes(method), owner, attribute):
                    if method.name.value != "__init__":
                        return None  # rebound after construction: not certain
                    answers.add(self._built(value))
        if len(answers) != 1:
            return None
        answer = answers.pop()
        return None if answer[0] is None else answer

    def _assignment_nodes(self, method: cst.FunctionDef) -> list[cst.CSTNode]:
        """``method``'s assignments, found once: a matcher walk per attribute asked about was most of the cost."""
        if id(method) not in self._assignment_cache:
            self._assignment_cache[id(method)] = list(m.findall(method, m.Assign() | m.AugAssign() | m.AnnAssign()))
        return self._assignment_cache[id(method)]

    def _built(self, value: cst.BaseExpression) -> tuple[str | None, bool]:
        """The file class ``value`` builds (an optional one, or the items of a ModuleList of them)."""
        if isinstance(value, cst.IfExp):
            built = {self._built(side) for side in (value.body, value.orelse) if not _is_none(side)}
            return built.pop() if len(built) == 1 else (None, False)
        if not isinstance(value, cst.Call):
            return None, False
        own = self._file_class(value)
        if own is not None:
            return own, False
        if self.index.qualified_names(value) & set(_MODULE_LIST) and len(value.args) == 1:
            items = value.args[0].value
            if isinstance(items, cst.ListComp):
                item = self._file_class(items.elt) if isinstance(items.elt, cst.Call) else None
                return item, item is not None
            if isinstance(items, cst.List) and items.elements:
                classes = {self._file_class(e.value) if isinstance(e.value, cst.Call) else None
                           for e in items.elements}
                if len(classes) == 1 and None not in classes:
                    return classes.pop(), True
        return None, False

    def _file_class(self, call: cst.Call) -> str | None:
        if not isinstance(call.func, cst.Name) or call.func.value not in self.family.classes:
            return None
        return call.func.value if self.index.lookup(self.index.scope_of(call.func), call.func.value) \
            is self.index.root else None

    # -- loop items ---------------------------------------------------------------------------------------
    def _loop_source(self, name: cst.Name, method: cst.FunctionDef, owner: str) -> str | None:
        """``attr`` when ``name`` is bound once, by ``for name in self.attr`` or ``enumerate(self.attr)``."""
        bindings, _ = self.index.local_uses(name)
        if len(bindings) != 1:
            return None
        loop = self.index.enclosing(bindings[0], cst.For)
        if loop is None or self.index.enclosing(loop, cst.FunctionDef) is not method:
            return None
        target: cst.BaseExpression = loop.target
        source = loop.iter
        if isinstance(source, cst.Call) and m.matches(source.func, m.Name("enumerate")) and len(source.args) == 1:
            if not (isinstance(target, cst.Tuple) and len(target.elements) == 2):
                return None
            target, source = target.elements[1].value, source.args[0].value
        if not (isinstance(target, cst.Name) and target.value == name.value and target is bindings[0]):
            return None
        if isinstance(source, cst.Attribute) and m.matches(source.value, m.Name(owner)):
            return source.attr.value
        return None


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _unpacks_into(node: cst.BaseExpression, target: m.BaseMatcherNode) -> bool:
    """Whether the tuple or list target ``node`` has ``target`` among its (nested, starred) elements."""
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, (cst.Tuple, cst.List)):
            pending.extend(e.value for e in current.elements)
        elif m.matches(current, target):
            return current is not node
    return False


def _assignments(nodes: list[cst.CSTNode], owner: str, attribute: str) -> Iterator[cst.BaseExpression]:
    """The values assigned to ``owner.attribute`` by ``nodes`` (an unknown value for augmented or tuple targets)."""
    target = m.Attribute(value=m.Name(owner), attr=m.Name(attribute))
    for node in nodes:
        if isinstance(node, cst.Assign):
            for assign_target in node.targets:
                if m.matches(assign_target.target, target):
                    yield node.value
                elif _unpacks_into(assign_target.target, target):
                    yield cst.Name("None")  # a value no rule resolves
        elif m.matches(node.target, target):  # type: ignore[attr-defined]
            yield cst.Name("None") if isinstance(node, cst.AugAssign) or node.value is None else node.value  # type: ignore[attr-defined]
