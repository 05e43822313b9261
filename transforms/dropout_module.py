"""Functional dropout switched by ``self.training`` -> an ``nn.Dropout`` submodule."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.literals import is_bool
from transforms.analysis.syntax import code_of
from transforms.base import Transform
from transforms.submodules import ClassFamily, InitSite, append_to_init, receiver

_DROPOUT = "torch.nn.functional.dropout"
# Its signature, in positional order.
_PARAMETERS = ("input", "p", "training", "inplace")
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
    site: InitSite
    dropout: cst.Attribute  # how __init__ spells torch.nn.Dropout


@dataclass
class _Class:
    node: cst.ClassDef  # the original node, which the index describes
    is_module: bool
    init: _Init | str | None = None  # surveyed on first need; a string says why nothing can be added
    modules: dict[tuple[str, str], str] = field(default_factory=dict)  # (p, inplace) -> attribute
    created: list[cst.SimpleStatementLine] = field(default_factory=list)


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
    Options = DropoutOptions

    def __init__(self, context: CodemodContext, options: DropoutOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.attribute = self.options.attribute
        self._stack: list[_Class | _Method] = []

    def focus(self) -> Iterable[cst.CSTNode]:
        return [call for call in self.index.nodes(cst.Call) if _DROPOUT in self.qualified_names(call)]

    def visit_Module(self, node: cst.Module) -> bool:
        self._family = ClassFamily(self.index, self.options.module_bases)
        return True

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._stack.append(_Class(node, self._family.is_module(node)))
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        frame = self._stack.pop()
        assert isinstance(frame, _Class)
        if not frame.created:
            return updated_node
        assert isinstance(frame.init, _Init)
        if frame.init.dropout is _TORCH_DROPOUT:
            AddImportsVisitor.add_needed_import(self.context, "torch")
        return append_to_init(updated_node, frame.init.site, frame.created)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if not self._stack:
            return False  # a module-level function has no instance whose training flag it could read
        parent = self._stack[-1]
        if isinstance(parent, _Class):
            self._stack.append(_Method(node.name.value, receiver(node)))
            return True
        # A closure inside a method still sees the method's instance, unless a parameter shadows it.
        shadowed = parent.receiver in {p.name.value for p in m.findall(node.params, m.Param()) if isinstance(p, cst.Param)}
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
        site = frame.init.site
        p = self._family.relocate(bound["p"].value, site, method.receiver) if "p" in bound else cst.Float("0.5")
        inplace = bound.get("inplace")
        moved_inplace = None if inplace is None else self._family.relocate(inplace.value, site, method.receiver)
        if p is None or (inplace is not None and moved_inplace is None):
            return self._leave_as_is(original_node, updated_node, (
                f"p and inplace must be constants or attributes that {frame.node.name.value}.__init__ settles"))
        name = self._module(frame, p, moved_inplace)
        value = bound["input"].with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT,
                                            comma=cst.MaybeSentinel.DEFAULT,
                                            whitespace_after_arg=updated_node.args[-1].whitespace_after_arg)
        return updated_node.with_changes(func=cst.Attribute(cst.Name(method.receiver), cst.Name(name)), args=[value])

    def _leave_as_is(self, original_node: cst.Call, updated_node: cst.Call, reason: str) -> cst.Call:
        self.report(original_node, f"{reason}; functional dropout left as is")
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
        if is_bool(training.value):
            return f"training hard-coded to {code_of(training.value)}"
        if method.receiver is None or not m.matches(
                training.value, m.Attribute(value=m.Name(method.receiver), attr=m.Name("training"))):
            return f"training={code_of(training.value)} is not the instance's training flag"
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
        """Where ``node``'s ``__init__`` can create the submodule and how it spells ``nn.Dropout``."""
        site = self._family.init_site(node)
        if isinstance(site, str):
            return site
        scope = self.index.scope_of(site.function.body.body[0])
        if self.index.qualified_names_in(scope, "nn.Dropout") == {"torch.nn.Dropout"}:
            return _Init(site, _NN_DROPOUT)
        if self.index.qualified_names_in(scope, "torch.nn.Dropout") - {"torch.nn.Dropout"}:
            return "`torch` in its __init__ is not the torch package"
        return _Init(site, _TORCH_DROPOUT)  # torch is imported if it is not yet

    def _module(self, frame: _Class, p: cst.BaseExpression, inplace: cst.BaseExpression | None) -> str:
        """The attribute of the ``nn.Dropout(p, inplace)`` submodule, created on first use."""
        assert isinstance(frame.init, _Init)
        if inplace is not None and m.matches(inplace, m.Name("False")):
            inplace = None  # nn.Dropout's default: share the module with calls that leave it out
        key = (code_of(p), "" if inplace is None else code_of(inplace))
        if key in frame.modules:
            return frame.modules[key]
        stem = self.attribute if self.attribute.endswith("_module") else f"{self.attribute}_module"
        name = self._family.fresh_attribute(frame.node, self.attribute, stem)
        frame.modules[key] = name
        args = [cst.Arg(p)]
        if inplace is not None:
            args.append(cst.Arg(inplace, keyword=cst.Name("inplace"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        frame.created.append(cst.SimpleStatementLine([cst.Assign(
            [cst.AssignTarget(cst.Attribute(cst.Name(frame.init.site.receiver), cst.Name(name)))],
            cst.Call(frame.init.dropout, args))]))
        return name
