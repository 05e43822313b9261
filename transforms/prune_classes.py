"""Drop the module's classes that the generated classes do not use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from transforms.analysis.names import names_read
from transforms.analysis.syntax import children
from transforms.library.base import EXPORTED_CLASSES, Transform, TransformError


@dataclass(frozen=True)
class PruneClassesOptions:
    keep: tuple[str, ...] = ()  # classes kept besides the recipe's (default: the recipe's classes only)


def _isinstance_classes(call: cst.Call) -> list[cst.BaseExpression] | None:
    """The class expressions of ``isinstance(x, C)`` / ``isinstance(x, (C, D))``, else None."""
    if not (isinstance(call.func, cst.Name) and call.func.value == "isinstance" and len(call.args) == 2):
        return None
    kinds = call.args[1].value
    if isinstance(kinds, cst.Tuple):
        return [e.value for e in kinds.elements]
    return [kinds]


def _reads(node: cst.CSTNode) -> set[str]:
    """Names ``node`` reads, except classes it only tests instances against."""
    names: set[str] = set()
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, cst.Call):
            kinds = _isinstance_classes(current)
            if kinds is not None and all(isinstance(k, cst.Name) for k in kinds):
                names |= names_read(current.func) | names_read(current.args[0])
                continue
        if isinstance(current, cst.Name):
            names |= names_read(current)
        elif isinstance(current, cst.Attribute):
            pending.append(current.value)
        elif isinstance(current, cst.Arg):
            pending.append(current.value)
        else:
            pending.extend(children(current))
    return names


class PruneClasses(Transform):
    """Drop top-level classes that neither the generated classes nor module-level code use.

    A modeling file also holds models the recipe does not convert (T5's task
    heads from 4.31: question answering, sequence and token classification).
    Left in, they are broken by the rewrites made for the converted classes
    (a stack's forward takes a shared weight they do not pass, a model returns
    one tensor they unpack).  Kept are the recipe's classes, the classes they
    use (bases, attributes, calls) and whatever module-level code uses; an
    instance test against a dropped class can no longer be true, so the class
    leaves the test (``isinstance(m, ())`` is False); ``__all__`` lists what is
    left::

        class T5Model(T5PreTrainedModel): ...                           # before
        class T5ForQuestionAnswering(T5PreTrainedModel): ...
        ...
            elif isinstance(module, (T5Model, T5ForQuestionAnswering)):
        __all__ = ["T5Model", "T5ForQuestionAnswering"]

        class T5Model(T5PreTrainedModel): ...                           # after
        ...
            elif isinstance(module, (T5Model,)):
        __all__ = ["T5Model"]
    """

    DESCRIPTION = "drop top-level classes the generated classes do not use"
    Options = PruneClassesOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        roots = set(self.context.scratch.get(EXPORTED_CLASSES, ())) | set(self.options.keep)
        classes = {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef)}
        missing = sorted(roots - set(classes))
        if missing:
            raise TransformError(f"the module defines no class {', '.join(missing)}")
        definitions = {s.name.value: s for s in self.module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}
        reached: set[str] = set()
        pending: list[cst.CSTNode] = [definitions[name] for name in sorted(roots)]
        pending += [s for s in self.module.body if not isinstance(s, (cst.ClassDef, cst.FunctionDef))
                    and not _is_all(s)]
        while pending:
            node = pending.pop()
            for name in _reads(node):
                if name in definitions and name not in reached:
                    reached.add(name)
                    pending.append(definitions[name])
        reached |= roots
        self._dropped = {name for name in classes if name not in reached}
        return [self.module] if self._dropped else []

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = []
        for statement in updated_node.body:
            if isinstance(statement, cst.ClassDef) and statement.name.value in self._dropped:
                continue
            body.append(self._all_without(statement) if isinstance(statement, cst.SimpleStatementLine)
                        and _is_all(statement) else statement)
        return updated_node.with_changes(body=body)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        kinds = _isinstance_classes(updated_node)
        if kinds is None or not any(isinstance(k, cst.Name) and k.value in self._dropped for k in kinds):
            return updated_node
        kept = [k for k in kinds if not (isinstance(k, cst.Name) and k.value in self._dropped)]
        elements = [cst.Element(k, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    for k in kept]
        if len(elements) > 1:
            elements[-1] = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        elif elements:
            elements[0] = elements[0].with_changes(comma=cst.Comma())
        second = updated_node.args[1].with_changes(value=cst.Tuple(elements))
        return updated_node.with_changes(args=[updated_node.args[0], second])

    def _all_without(self, statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, (cst.List, cst.Tuple))
        elements = [e for e in assign.value.elements
                    if not (isinstance(e.value, cst.SimpleString) and e.value.evaluated_value in self._dropped)]
        if elements and len(elements) < len(assign.value.elements):
            elements[-1] = elements[-1].with_changes(comma=assign.value.elements[-1].comma)
        return statement.with_changes(body=[assign.with_changes(value=assign.value.with_changes(elements=elements))])


def _is_all(statement: cst.CSTNode) -> bool:
    """``__all__ = [...]`` (a list or tuple of names)."""
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
            and isinstance(statement.body[0].targets[0].target, cst.Name)
            and statement.body[0].targets[0].target.value == "__all__"
            and isinstance(statement.body[0].value, (cst.List, cst.Tuple)))
