"""Functional dropout switched by ``self.training`` -> an ``nn.Dropout`` submodule."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import ScopeProvider

from transforms.base import Transform
from transforms.positions import located

_DROPOUT = "torch.nn.functional.dropout"
# Its signature, in positional order.
_PARAMETERS = ("input", "p", "training", "inplace")
_BOOLEAN = m.Name("True") | m.Name("False")
_TORCH_DROPOUT = cst.Attribute(cst.Attribute(cst.Name("torch"), cst.Name("nn")), cst.Name("Dropout"))
_NN_DROPOUT = cst.Attribute(cst.Name("nn"), cst.Name("Dropout"))

DEFAULT_MODULE_BASES = ("torch.nn.Module", "torch.nn.modules.module.Module",
                        "transformers.modeling_utils.PreTrainedModel")


@dataclass(frozen=True)
class DropoutOptions:
    attribute: str = "dropout"  # the preferred name of the new submodule
    module_bases: tuple[str, ...] = DEFAULT_MODULE_BASES  # qualified names whose subclasses are modules


@dataclass
class _Method:
    name: str
    receiver: str | None  # the name bound to the instance; None in static and class methods


@dataclass
class _Init:
    """What a line appended to a class's ``__init__`` can rely on."""

    index: int  # position among the class body's statements
    receiver: str
    settled: frozenset[str]  # attributes whose value at the end of __init__ is the one methods see
    dropout: cst.Attribute  # how __init__ spells torch.nn.Dropout


@dataclass
class _Class:
    node: cst.ClassDef  # the original node, which metadata describes
    is_module: bool
    init: _Init | str | None = None  # surveyed on first need; a string says why nothing can be added
    modules: dict[tuple[str, str], str] = field(default_factory=dict)  # (p, inplace) -> attribute
    created: list[cst.SimpleStatementLine] = field(default_factory=list)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _receiver(function: cst.FunctionDef) -> str | None:
    if any(m.matches(d.decorator, m.Name("staticmethod") | m.Name("classmethod")) for d in function.decorators):
        return None
    positional = [*function.params.posonly_params, *function.params.params]
    return positional[0].name.value if positional else None


def _methods(node: cst.ClassDef) -> Iterator[tuple[int, cst.FunctionDef, str]]:
    for index, statement in enumerate(node.body.body):
        if isinstance(statement, cst.FunctionDef) and (receiver := _receiver(statement)) is not None:
            yield index, statement, receiver


def _rebound(nodes: Iterable[cst.CSTNode], receiver: str) -> set[str]:
    """Attributes of ``receiver`` that assignments among ``nodes`` (and below them) rebind."""
    names: set[str] = set()
    for node in nodes:
        for found in m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign()):
            if isinstance(found, cst.AnnAssign) and found.value is None:
                continue
            targets = [found.target]
            while targets:
                target = targets.pop()
                if isinstance(target, (cst.Tuple, cst.List)):
                    targets.extend(element.value for element in target.elements)
                elif m.matches(target, m.Attribute(value=m.Name(receiver))):
                    names.add(target.attr.value)
    return names


class DropoutModule(Transform):
    """Turn ``F.dropout(x, p, training=self.training)`` into a call of an ``nn.Dropout`` submodule.

    Tracers record ``self.training`` as the constant it was while tracing, so a
    model traced in eval mode never drops out after ``gm.train()``; a submodule
    stays a ``call_module`` node that follows the mode.  ``p`` is now evaluated
    at the end of ``__init__``, so only constants and attributes that
    ``__init__`` settles are accepted; ``nn.Dropout`` calls the same
    ``F.dropout``, so seeded outputs are bit-equal.  The submodule is named
    ``attribute`` unless the class (or a base or subclass in the file) uses
    that name, as T5Attention does for its float ``self.dropout``; then
    ``<attribute>_module``, ``<attribute>_module_1``...::

        self.dropout = config.dropout_rate                          # __init__, before and after
        self.dropout_module = nn.Dropout(self.dropout)              # __init__, appended
        w = F.dropout(w, p=self.dropout, training=self.training)    # forward, before
        w = self.dropout_module(w)                                  # forward, after
    """

    DESCRIPTION = "F.dropout(x, p, training=self.training) -> an nn.Dropout submodule made in __init__"
    # Qualified names come straight from the scopes: QualifiedNameProvider computes the same thing but
    # first walks the whole file to wrap every node, which doubles the metadata cost on modeling_t5.py.
    METADATA_DEPENDENCIES = (ScopeProvider,)

    Options = DropoutOptions

    def __init__(self, context: CodemodContext, options: DropoutOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.attribute = self.options.attribute
        self.module_bases = frozenset(self.options.module_bases)
        self._stack: list[_Class | _Method] = []
        self._classes: dict[str, cst.ClassDef] = {}  # the file's top-level classes, for inheritance
        self._names: dict[cst.ClassDef, set[str]] = {}  # attribute names each class uses
        self._spellings: set[str] = set()

    def visit_Module(self, node: cst.Module) -> bool:
        self._classes = {s.name.value: s for s in node.body if isinstance(s, cst.ClassDef)}
        scope = self.get_metadata(ScopeProvider, node)
        assert scope is not None
        aliases = {a.name for a in scope.assignments
                   if any(q.name == _DROPOUT for q in scope.get_qualified_names_for(a.name))}
        # A call resolving to dropout is spelled `<...>.dropout(`, or through an alias imported at module
        # level; an alias imported in a method puts "dropout" in the method's text.
        self._spellings = {"dropout", *aliases}
        return True

    def _bases(self, node: cst.ClassDef) -> set[str]:
        return set().union(*(self.qualified_names(base.value) for base in node.bases))

    def _lineage(self, node: cst.ClassDef) -> list[cst.ClassDef]:
        """The classes of this file that ``node`` derives from, nearest first."""
        found: list[cst.ClassDef] = []
        pending = list(self._bases(node))
        while pending:
            base = self._classes.get(pending.pop(0))
            if base is not None and base is not node and base not in found:
                found.append(base)
                pending.extend(self._bases(base))
        return found

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        is_module = any(self._bases(c) & self.module_bases for c in [node, *self._lineage(node)])
        self._stack.append(_Class(node, is_module))
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        frame = self._stack.pop()
        assert isinstance(frame, _Class)
        if not frame.created:
            return updated_node
        assert isinstance(frame.init, _Init)
        if frame.init.dropout is _TORCH_DROPOUT:
            AddImportsVisitor.add_needed_import(self.context, "torch")
        body = list(updated_node.body.body)
        init = body[frame.init.index]
        assert isinstance(init, cst.FunctionDef) and isinstance(init.body, cst.IndentedBlock)
        body[frame.init.index] = init.with_changes(body=init.body.with_changes(body=[*init.body.body, *frame.created]))
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # Only code in methods can read an instance's training flag.
        return bool(self._stack) and isinstance(self._stack[-1], _Method)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if not self._stack:
            return False  # a module-level function has no instance whose training flag it could read
        parent = self._stack[-1]
        if isinstance(parent, _Class):
            self._stack.append(_Method(node.name.value, _receiver(node)))
            # Cheap text test: skip rebuilding the (many) methods that cannot call dropout.
            text = _code(node)
            return any(spelling in text for spelling in self._spellings)
        # A closure inside a method still sees the method's instance, unless a parameter shadows it.
        shadowed = parent.receiver in {param.name.value for param in m.findall(node.params, m.Param())}
        self._stack.append(_Method(parent.name, None if shadowed else parent.receiver))
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self._stack:  # visit_FunctionDef pushed exactly when the stack was not empty
            self._stack.pop()
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        method = self._stack[-1] if self._stack else None
        if not isinstance(method, _Method) or _DROPOUT not in self.qualified_names(original_node.func):
            return updated_node
        frame = next(entry for entry in reversed(self._stack) if isinstance(entry, _Class))
        bound = self._bind(updated_node.args)
        reason = bound if isinstance(bound, str) else self._refusal(bound, frame, method)
        if reason is not None:
            return self._leave_as_is(original_node, updated_node, reason)
        assert isinstance(bound, dict) and method.receiver is not None and isinstance(frame.init, _Init)
        p = self._relocate(bound["p"].value, frame.init, method.receiver) if "p" in bound else cst.Float("0.5")
        inplace = bound.get("inplace")
        moved_inplace = None if inplace is None else self._relocate(inplace.value, frame.init, method.receiver)
        if p is None or (inplace is not None and moved_inplace is None):
            return self._leave_as_is(original_node, updated_node, (
                f"p and inplace must be constants or attributes that {frame.node.name.value}.__init__ settles"))
        name = self._module(frame, p, moved_inplace)
        value = bound["input"].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT,
                                            comma=cst.MaybeSentinel.DEFAULT,
                                            whitespace_after_arg=updated_node.args[-1].whitespace_after_arg)
        return updated_node.with_changes(func=cst.Attribute(cst.Name(method.receiver), cst.Name(name)), args=[value])

    def _leave_as_is(self, original_node: cst.Call, updated_node: cst.Call, reason: str) -> cst.Call:
        self.warn(located(self, original_node, f"{reason}; functional dropout left as is"))
        return updated_node

    @staticmethod
    def _bind(args: Sequence[cst.Arg]) -> dict[str, cst.Arg] | str:
        bound: dict[str, cst.Arg] = {}
        for position, arg in enumerate(args):
            if arg.star:
                return "dropout called with * or ** arguments"
            if arg.keyword is None and position >= len(_PARAMETERS):
                return "dropout called with too many arguments"
            name = _PARAMETERS[position] if arg.keyword is None else arg.keyword.value
            if name not in _PARAMETERS or name in bound:
                return f"dropout called with an unexpected argument `{name}`"
            bound[name] = arg
        return bound if "input" in bound else "dropout called without its input"

    def _refusal(self, bound: dict[str, cst.Arg], frame: _Class, method: _Method) -> str | None:
        """Why this call must stay functional, or None when it can become a submodule call."""
        training = bound.get("training")
        if training is None:
            return "training hard-coded to True (the default)"
        if m.matches(training.value, _BOOLEAN):
            return f"training hard-coded to {_code(training.value)}"
        if method.receiver is None or not m.matches(
                training.value, m.Attribute(value=m.Name(method.receiver), attr=m.Name("training"))):
            return f"training={_code(training.value)} is not the instance's training flag"
        name = frame.node.name.value
        if not frame.is_module:
            return f"{name} is not a known nn.Module subclass (see module_bases)"
        if method.name == "__init__":
            return f"the dropout in {name}.__init__ would run before its submodule exists"
        if frame.init is None:
            frame.init = self._survey(frame.node)
        if isinstance(frame.init, str):
            return f"cannot add a submodule to {name}: {frame.init}"
        return None

    def _survey(self, node: cst.ClassDef) -> _Init | str:
        """Where and how ``node``'s ``__init__`` can create a submodule, or why it cannot."""
        found = [(index, method, receiver) for index, method, receiver in _methods(node)
                 if method.name.value == "__init__"]
        if not found:
            return "it has no __init__"
        index, init, receiver = found[-1]
        if not isinstance(init.body, cst.IndentedBlock):
            return "its __init__ is a one-line body"
        if m.findall(init, m.Return()):
            return "its __init__ may return before its end"
        scope = self.get_metadata(ScopeProvider, init.body.body[0])
        assert scope is not None
        if {q.name for q in scope.get_qualified_names_for("nn.Dropout")} == {"torch.nn.Dropout"}:
            dropout = _NN_DROPOUT
        elif {q.name for q in scope.get_qualified_names_for("torch.nn.Dropout")} - {"torch.nn.Dropout"}:
            return "`torch` in its __init__ is not the torch package"
        else:
            dropout = _TORCH_DROPOUT  # torch is imported if it is not yet
        reassigned = set().union(*(_rebound([method], r) for _, method, r in _methods(node) if method is not init))
        # Only unconditional top-level assignments are sure to have run when the appended line does.
        top_level = [s for s in init.body.body if isinstance(s, cst.SimpleStatementLine)]
        return _Init(index, receiver, frozenset(_rebound(top_level, receiver) - reassigned), dropout)

    def _relocate(self, expression: cst.BaseExpression, init: _Init, receiver: str) -> cst.BaseExpression | None:
        """``expression`` as the end of ``__init__`` writes it, or None when its value could differ there."""
        if isinstance(expression, (cst.Integer, cst.Float)) or m.matches(expression, _BOOLEAN):
            return expression
        if isinstance(expression, cst.UnaryOperation):
            operand = self._relocate(expression.expression, init, receiver)
            return None if operand is None else expression.with_changes(expression=operand)
        if isinstance(expression, cst.BinaryOperation):
            left = self._relocate(expression.left, init, receiver)
            right = self._relocate(expression.right, init, receiver)
            return None if left is None or right is None else expression.with_changes(left=left, right=right)
        if not isinstance(expression, cst.Attribute):
            return None
        if m.matches(expression.value, m.Name(receiver)):
            if expression.attr.value not in init.settled:
                return None
            return expression.with_changes(value=cst.Name(init.receiver))
        owner = self._relocate(expression.value, init, receiver)
        return None if owner is None else expression.with_changes(value=owner)

    def _used_names(self, node: cst.ClassDef) -> set[str]:
        """Names a new attribute of ``node``'s instances could clash with."""
        if node not in self._names:
            names = self._names[node] = set()
            for statement in node.body.body:
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    names.add(statement.name.value)
                elif isinstance(statement, cst.SimpleStatementLine):
                    for assignment in m.findall(statement, m.AssignTarget() | m.AnnAssign()):
                        names.update(name.value for name in m.findall(assignment.target, m.Name()))
            for _, method, receiver in _methods(node):
                names.update(a.attr.value for a in m.findall(method, m.Attribute(value=m.Name(receiver))))
        return self._names[node]

    def _candidates(self) -> Iterator[str]:
        yield self.attribute
        stem = self.attribute if self.attribute.endswith("_module") else f"{self.attribute}_module"
        if stem != self.attribute:
            yield stem
        yield from (f"{stem}_{index}" for index in count(1))

    def _module(self, frame: _Class, p: cst.BaseExpression, inplace: cst.BaseExpression | None) -> str:
        """The attribute of the ``nn.Dropout(p, inplace)`` submodule, created on first use."""
        assert isinstance(frame.init, _Init)
        if inplace is not None and m.matches(inplace, m.Name("False")):
            inplace = None  # nn.Dropout's default: share the module with calls that leave it out
        key = (_code(p), "" if inplace is None else _code(inplace))
        if key in frame.modules:
            return frame.modules[key]
        # Instances of bases and subclasses share the attribute namespace.
        family = [frame.node, *self._lineage(frame.node),
                  *(c for c in self._classes.values() if frame.node in self._lineage(c))]
        taken = set().union(*(self._used_names(c) for c in family))
        name = next(candidate for candidate in self._candidates() if candidate not in taken)
        self._used_names(frame.node).add(name)
        frame.modules[key] = name
        args = [cst.Arg(p)]
        if inplace is not None:
            args.append(cst.Arg(inplace, keyword=cst.Name("inplace"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        frame.created.append(cst.SimpleStatementLine([cst.Assign(
            [cst.AssignTarget(cst.Attribute(cst.Name(frame.init.receiver), cst.Name(name)))],
            cst.Call(frame.init.dropout, args))]))
        return name
