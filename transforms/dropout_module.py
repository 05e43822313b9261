"""Functional dropout switched by ``self.training`` -> an ``nn.Dropout`` submodule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.dropout_calls import DROPOUT, bind, function_refusal, method_refusal
from transforms.analysis.syntax import all_params, code_of
from transforms.library.base import Transform
from transforms.library.submodules import MODULE_BASES, ClassFamily, InitSite, append_to_init, receiver

_TORCHDROPOUT = cst.Attribute(cst.Attribute(cst.Name("torch"), cst.Name("nn")), cst.Name("Dropout"))
_NNDROPOUT = cst.Attribute(cst.Name("nn"), cst.Name("Dropout"))


@dataclass(frozen=True)
class DropoutOptions:
    attribute: str = "dropout"  # the preferred name of the new submodule
    module_bases: tuple[str, ...] = MODULE_BASES  # qualified names whose subclasses are modules


@dataclass
class _Method:
    name: str
    receiver: str | None  # the name bound to the instance; None in static and class methods


@dataclass
class _Function:
    """A module-level function whose dropout reads the training flag of a module its callers pass."""

    name: str
    attribute: str  # the FunctionalDropout submodule every caller class owns
    calls: set[int]  # the dropout calls (original nodes) that become calls of it


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

    A module-level function reading the training flag of a module it is given
    (transformers 5.x's ``eager_attention_forward(module, ...)``) cannot own a
    submodule, and ``p`` is its argument: every class of the file that refers to
    the function (its callers) gets a ``stateless.FunctionalDropout`` under one
    name, and the function calls it with the rate::

        w = F.dropout(w, p=dropout, training=module.training)       # in the function, before
        w = module.dropout_module(w, dropout)                       # after
        self.dropout_module = stateless.FunctionalDropout()         # each caller's __init__, appended

    The function must be referred to only from module classes that can take
    the submodule; otherwise it is left as is, with a warning naming the use.
    """

    DESCRIPTION = "F.dropout(x, p, training=self.training) -> an nn.Dropout submodule made in __init__"
    Options = DropoutOptions

    def __init__(self, context: CodemodContext, options: DropoutOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.attribute = self.options.attribute
        self._stack: list[_Class | _Method | _Function] = []

    def focus(self) -> Iterable[cst.CSTNode]:
        self._family = ClassFamily(self.index, self.options.module_bases)
        self._functions: dict[int, _Function] = {}  # id(original FunctionDef) -> its plan
        self._callers: dict[int, list[str]] = {}  # id(original ClassDef) -> FunctionalDropout attributes it owns
        calls = [call for call in self.index.nodes(cst.Call) if DROPOUT in self.qualified_names(call)]
        if calls:
            for statement in self.module.body:
                if isinstance(statement, cst.FunctionDef):
                    self._plan_function(statement)
        callers = [node for node in self._family.classes.values() if id(node) in self._callers]
        return [*calls, *callers]

    def _plan_function(self, function: cst.FunctionDef) -> None:
        """Whether ``function``'s dropouts can read a submodule its callers own, and under which name."""
        parameters = {param.name.value for param in all_params(function.params, starred=True)}
        calls: set[int] = set()
        for call in self.index.nodes(cst.Call):
            if DROPOUT not in self.qualified_names(call.func) or \
                    self.index.enclosing(call, cst.FunctionDef) is not function:
                continue
            bound = bind(call.args)
            reason = bound if isinstance(bound, str) else function_refusal(bound, parameters)
            if reason is not None:
                self.report(call, f"{reason}; functional dropout in {function.name.value} left as is")
                continue
            calls.add(id(call))
        if not calls:
            return
        _, reads = self.index.local_uses(function.name)
        callers: list[cst.ClassDef] = []
        for read in reads:
            owner = next((a for a in self.index.ancestors(read) if isinstance(a, cst.ClassDef)
                          and a in self._family.classes.values()), None)
            if owner is None:
                self.report(read, f"the dropout of {function.name.value} must stay functional: "
                                  "it is used outside the file's classes")
                return
            reason = None
            if not self._family.is_module(owner):
                reason = f"{owner.name.value} uses it and is not a known nn.Module subclass (see module_bases)"
            elif isinstance(site := self._survey(owner), str):
                reason = f"cannot add a submodule to {owner.name.value}, which uses it: {site}"
            if reason is not None:
                self.report(read, f"the dropout of {function.name.value} must stay functional: {reason}")
                return
            if owner not in callers:
                callers.append(owner)
        if not callers:
            self.report(function, f"no class of the file uses {function.name.value}: its dropout stays functional")
            return
        stem = self.attribute if self.attribute.endswith("_module") else f"{self.attribute}_module"
        attribute = self._family.fresh_attribute(callers[0], self.attribute, stem, callers[1:])
        self._functions[id(function)] = _Function(function.name.value, attribute, calls)
        for caller in callers:
            self._callers.setdefault(id(caller), []).append(attribute)

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        frame = _Class(node, self._family.is_module(node))
        self._stack.append(frame)
        for attribute in self._callers.get(id(node), ()):
            frame.init = self._survey(node)  # a planned caller: _plan_function checked it can take a submodule
            assert isinstance(frame.init, _Init)
            AddImportsVisitor.add_needed_import(self.context, "stateless")
            frame.created.append(cst.SimpleStatementLine([cst.Assign(
                [cst.AssignTarget(cst.Attribute(cst.Name(frame.init.site.receiver), cst.Name(attribute)))],
                cst.Call(cst.parse_expression("stateless.FunctionalDropout"), []))]))
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        frame = self._stack.pop()
        assert isinstance(frame, _Class)
        if not frame.created:
            return updated_node
        assert isinstance(frame.init, _Init)
        if frame.init.dropout is _TORCHDROPOUT:
            AddImportsVisitor.add_needed_import(self.context, "torch")
        return append_to_init(updated_node, frame.init.site, frame.created)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if not self._stack:
            plan = self._functions.get(id(node))
            if plan is None:
                return False  # a module-level function has no instance whose training flag it could read
            self._stack.append(plan)
            return True
        parent = self._stack[-1]
        if isinstance(parent, _Function):
            return False  # a closure in the function: its dropouts were not planned
        if isinstance(parent, _Class):
            self._stack.append(_Method(node.name.value, receiver(node)))
            return True
        # A closure inside a method still sees the method's instance, unless a parameter shadows it.
        shadowed = parent.receiver in {p.name.value for p in m.findall(node.params, m.Param()) if isinstance(p, cst.Param)}
        self._stack.append(_Method(parent.name, None if shadowed else parent.receiver))
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self._stack and not (isinstance(self._stack[-1], _Function) and id(original_node) not in self._functions):
            self._stack.pop()  # what visit_FunctionDef pushed (nothing for a closure in a planned function)
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        method = self._stack[-1] if self._stack else None
        if isinstance(method, _Function) and id(original_node) in method.calls:
            return self._call_functional(method, updated_node)
        if not isinstance(method, _Method) or DROPOUT not in self.qualified_names(original_node.func):
            return updated_node
        frame = next(entry for entry in reversed(self._stack) if isinstance(entry, _Class))
        bound = bind(updated_node.args)
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

    def _call_functional(self, plan: _Function, updated_node: cst.Call) -> cst.Call:
        """``F.dropout(x, p, training=module.training)`` -> ``module.<attribute>(x, p)``."""
        bound = bind(updated_node.args)
        assert isinstance(bound, dict)  # _plan_function bound the same arguments
        module = bound["training"].value.value  # type: ignore[attr-defined]  # <parameter>.training
        args = [bound["input"], bound["p"] if "p" in bound else cst.Arg(cst.Float("0.5"))]
        args = [arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT, comma=cst.MaybeSentinel.DEFAULT)
                for arg in args]
        args[0] = args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return updated_node.with_changes(func=cst.Attribute(module, cst.Name(plan.attribute)), args=args)

    def _leave_as_is(self, original_node: cst.Call, updated_node: cst.Call, reason: str) -> cst.Call:
        self.report(original_node, f"{reason}; functional dropout left as is")
        return updated_node

    def _refusal(self, bound: dict[str, cst.Arg], frame: _Class, method: _Method) -> str | None:
        """Why this call must stay functional, or None when it can become a submodule call."""
        reason = method_refusal(bound, method.receiver)
        if reason is not None:
            return reason
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
            return _Init(site, _NNDROPOUT)
        if self.index.qualified_names_in(scope, "torch.nn.Dropout") - {"torch.nn.Dropout"}:
            return "`torch` in its __init__ is not the torch package"
        return _Init(site, _TORCHDROPOUT)  # torch is imported if it is not yet

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
