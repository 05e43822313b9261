"""Plumb a shared embedding weight explicitly, so models can switch to stateless layers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import dotted_name
from transforms.base import Transform
from transforms.options import OptionError


@dataclass(frozen=True)
class ModelOptions:
    users: tuple[str, ...] = ()  # submodule paths that embed with the shared module
    callers: tuple[str, ...] = ()  # calls in forward that reach a stack (e.g. self.encoder)
    tied_linear: str | None = None  # a Linear whose weight is tied to the shared one...
    tied_when: str | None = None  # ...when this expression (over self) is true

    def __post_init__(self) -> None:
        if (self.tied_linear is None) != (self.tied_when is None):
            raise OptionError("tied_when", "tied_linear and tied_when go together")


@dataclass(frozen=True)
class SharedWeightOptions:
    stack: str  # the class whose forward embeds tokens
    consumer: str  # the embedding call inside it, e.g. self.embed_tokens
    parameter: str  # the new first parameter of the stack's forward
    shared: str  # the model attribute holding the shared module
    weight: str  # the name of the top-level parameter in the stateless form
    models: dict[str, ModelOptions]
    runtime: str = "stateless"  # the module the generated code imports the runtime from


class SharedWeight(Transform):
    """Pass the shared weight to every user explicitly; add ``make_stateless``/``make_stateful``.

    A module registered under several names (T5's ``shared`` is also
    ``encoder.embed_tokens``, ``decoder.embed_tokens`` and, tied, the LM head's
    weight) hides the sharing from partitioners.  The recipe names the shared
    module, its users, and the stack class that embeds tokens.  The stack's
    forward takes the weight first and hands it to its embedding; model forwards
    pass it at every call site; the runtime (``stateless``) decides per call
    whether the user is a stateless layer (stateless form) or the stock module
    (stateful form, the default, with HF state-dict keys)::

        class T5Stack(...):                                  # before
            def forward(self, input_ids=None, ...):
                inputs_embeds = self.embed_tokens(input_ids)
        class T5Model(...):
            def forward(self, ...):
                encoder_outputs = self.encoder(input_ids=input_ids)

        class T5Stack(...):                                  # after
            def forward(self, shared_embedding, input_ids=None, ...):
                inputs_embeds = stateless.call_shared(self.embed_tokens, shared_embedding, input_ids)
        class T5Model(...):
            def forward(self, ...):
                encoder_outputs = self.encoder(stateless.shared_weight(self, "shared", "shared_embed_weight"),
                                               input_ids=input_ids)
            def make_stateless(self):
                return stateless.make_stateless(self, shared="shared", weight="shared_embed_weight", ...)
    """

    DESCRIPTION = "pass the shared embedding weight explicitly; add make_stateless/make_stateful"

    Options = SharedWeightOptions

    def __init__(self, context: CodemodContext, options: SharedWeightOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        o = self.options
        self.stack, self.consumer, self.parameter = o.stack, o.consumer, o.parameter
        self.shared, self.weight, self.models, self.runtime = o.shared, o.weight, o.models, o.runtime
        self._class: list[str] = []

    def _runtime(self, name: str) -> cst.Attribute:
        AddImportsVisitor.add_needed_import(self.context, self.runtime)
        return cst.Attribute(cst.parse_expression(self.runtime), cst.Name(name))

    def _weight_expression(self) -> cst.Call:
        return cst.Call(self._runtime("shared_weight"), [
            cst.Arg(cst.Name("self")), cst.Arg(cst.SimpleString(f'"{self.shared}"')),
            cst.Arg(cst.SimpleString(f'"{self.weight}"'))])

    def _is_weight_expression(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Call) and f"{self.runtime}.shared_weight" in self.qualified_names(node)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [s for s in self.module.body if isinstance(s, cst.ClassDef)
                and (s.name.value == self.stack or s.name.value in self.models)]

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._class.append(node.name.value)
        return node.name.value == self.stack or node.name.value in self.models

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node.name.value == "forward"

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._class:
            return updated_node
        owner, callee = self._class[-1], dotted_name(updated_node.func)
        if owner == self.stack and callee == self.consumer:
            return cst.Call(self._runtime("call_shared"), [
                cst.Arg(updated_node.func), cst.Arg(cst.Name(self.parameter)), *updated_node.args])
        spec = self.models.get(owner)
        if spec is None:
            return updated_node
        if callee in spec.callers:
            if updated_node.args and self._is_weight_expression(updated_node.args[0].value):
                return updated_node
            return updated_node.with_changes(args=[cst.Arg(self._weight_expression()), *updated_node.args])
        if spec.tied_linear is not None and callee == f"self.{spec.tied_linear}":
            return cst.Call(self._runtime("call_shared"), [
                cst.Arg(updated_node.func), cst.Arg(self._weight_expression()), *updated_node.args])
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self._class[-1:] != [self.stack] or updated_node.name.value != "forward":
            return updated_node
        params = list(updated_node.params.params)
        if len(params) > 1 and params[1].name.value == self.parameter:
            return updated_node
        new = cst.Param(cst.Name(self.parameter), comma=params[0].comma)
        return updated_node.with_changes(params=updated_node.params.with_changes(
            params=[params[0], new, *params[1:]]))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        name = self._class.pop()
        spec = self.models.get(name)
        if spec is None:
            return updated_node
        existing = {f.name.value for f in updated_node.body.body if isinstance(f, cst.FunctionDef)}
        added = [method for method in self._methods(spec) if method.name.value not in existing]
        if not added:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*updated_node.body.body, *added]))

    def _methods(self, spec: ModelOptions) -> list[cst.FunctionDef]:
        quoted = [f'"{user}"' for user in spec.users]
        users = "(" + ", ".join(quoted) + ("," if len(quoted) == 1 else "") + ")"
        tied = spec.tied_linear
        tied_value = f'"{tied}" if {spec.tied_when} else None' if tied else "None"
        self._runtime("make_stateless")
        source = f'''
class Template:
    def make_stateless(self):
        """Make the shared embedding one top-level parameter, {self.weight}, used by stateless layers.

        For pipeline partitioners; a no-op if already stateless. stateful_state_dict() and
        make_stateful() give the stock layout (HF state-dict keys) back.
        """
        return {self.runtime}.make_stateless(
            self,
            shared="{self.shared}",
            weight="{self.weight}",
            users={users},
            tied_linear={tied_value},
        )

    def make_stateful(self):
        """Undo make_stateless(): the stock module layout, sharing the same parameter."""
        return {self.runtime}.make_stateful(self)

    def stateful_state_dict(self):
        """The state dict with stock HF keys, in either form."""
        return {self.runtime}.stateful_state_dict(self)
'''
        template = cst.parse_module(source).body[0]
        assert isinstance(template, cst.ClassDef)
        return [method.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
                for method in template.body.body if isinstance(method, cst.FunctionDef)]
