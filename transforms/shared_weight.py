"""Plumb a shared embedding weight explicitly, so models can switch to stateless layers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from common.schema import OptionError
from transforms.analysis.syntax import all_params, append_item, dotted_name
from transforms.library.base import Transform, TransformError


@dataclass(frozen=True)
class ModelOptions:
    """A class owning the shared weight: a top-level model, given ``make_stateless()``."""

    shared: str  # the module holding the weight in the stateful form, a path from the class
    users: tuple[str, ...]  # the modules that are that embedding (paths from the class)
    tied_linear: str | None = None  # a Linear whose weight is tied to the shared one...
    tied_when: str | None = None  # ...when this expression (over self) is true

    def __post_init__(self) -> None:
        if not self.users:
            raise OptionError("users", "name at least one module embedding with the shared weight")
        if (self.tied_linear is None) != (self.tied_when is None):
            raise OptionError("tied_when", "tied_linear and tied_when go together")


@dataclass(frozen=True)
class ForwardOptions:
    """One class's forward on the way from a model down to the weight's uses."""

    calls: dict[str, str] = field(default_factory=dict)  # a call (self.encoder) -> the class it runs, which receives it
    uses: tuple[str, ...] = ()  # calls that compute with the weight (self.embed_tokens, a tied self.lm_head)


@dataclass(frozen=True)
class SharedWeightOptions:
    weight: str  # the name of the top-level parameter in the stateless form
    parameter: str  # the forward parameter that carries the weight into a class that receives it
    models: dict[str, ModelOptions]
    forwards: dict[str, ForwardOptions]
    runtime: str = "stateless"  # the module the generated code imports the runtime from

    def __post_init__(self) -> None:
        if not self.models:
            raise OptionError("models", "name at least one class owning the shared weight")
        for name in self.models:
            if name not in self.forwards:
                raise OptionError(f"forwards.{name}", f"missing: model {name} must pass on or use the weight")
        receivers = {target for spec in self.forwards.values() for target in spec.calls.values()}
        for name, spec in self.forwards.items():
            for call, target in spec.calls.items():
                if target not in self.forwards:
                    raise OptionError(f"forwards.{name}.calls", f"{call} runs {target}, which has no forwards entry")
            if name not in self.models and name not in receivers:
                raise OptionError(f"forwards.{name}", "neither a model nor called with the weight: it cannot get it")
            if not spec.calls and not spec.uses:
                raise OptionError(f"forwards.{name}", "neither calls nor uses: nothing to plumb")


class SharedWeight(Transform):
    """Pass the shared weight to every use explicitly; add ``make_stateless``/``make_stateful``.

    A module registered under several names (T5's ``shared`` is also
    ``encoder.embed_tokens``, ``decoder.embed_tokens`` and, tied, the LM head's
    weight) or a weight two modules hold (GPT-2's ``transformer.wte`` and
    ``lm_head``) hides the sharing from partitioners.  The recipe names the
    *models* owning the weight and, per class, the calls of its ``forward`` that
    lead down to the weight's uses (``forwards.<Class>.calls``, each naming the
    class it runs) and the uses themselves (``uses``).  Then:

    * a use ``self.embed(x)`` becomes ``stateless.call_shared(self.embed, w, x)``;
      the runtime decides per call whether the module is a stateless layer (the
      stateless form) or the stock module (the stateful form, with HF keys);
    * a class that only receives the weight (a stack, an embeddings block, a head)
      takes it as a new first ``forward`` parameter, and its callers pass it first;
    * a model that is also called by another model (GPT-2's ``GPT2Model`` inside
      ``GPT2LMHeadModel``) takes it as a last, optional keyword parameter, passed
      by keyword, and falls back to its own weight when called on its own;
    * ``w`` is the parameter in a class that receives it, else
      ``stateless.shared_weight(self, "<shared>", "<weight>")``, which reads the
      weight in either form::

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

        class GPT2Model(...):                                # after (a model called by another)
            def forward(self, input_ids=None, ..., shared_embedding=None):
                inputs_embeds = stateless.call_shared(
                    self.wte, stateless.shared_weight(self, "wte", "shared_embed_weight", shared_embedding), input_ids)
        class GPT2LMHeadModel(...):
            def forward(self, input_ids=None, ...):
                transformer_outputs = self.transformer(
                    input_ids, ..., shared_embedding=stateless.shared_weight(self, "transformer.wte", ...))
    """

    DESCRIPTION = "pass the shared embedding weight explicitly; add make_stateless/make_stateful"

    Options = SharedWeightOptions

    def __init__(self, context: CodemodContext, options: SharedWeightOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        o = self.options
        self.weight, self.parameter, self.runtime = o.weight, o.parameter, o.runtime
        self.models, self.forwards = o.models, o.forwards
        self.receivers = {target for spec in o.forwards.values() for target in spec.calls.values()}
        self._class: list[str] = []
        self._in_forward = False
        self._found: set[str] = set()  # the calls and uses met in the current class's forward

    # -- what a class passes and receives ---------------------------------------------------------------
    def _runtime(self, name: str) -> cst.Attribute:
        AddImportsVisitor.add_needed_import(self.context, self.runtime)
        return cst.Attribute(cst.parse_expression(self.runtime), cst.Name(name))

    def _optional(self, name: str) -> bool:
        """A model that is also called with the weight: it takes it as an optional keyword."""
        return name in self.models and name in self.receivers

    def _weight_in(self, owner: str) -> cst.BaseExpression:
        """The weight as ``owner``'s forward reads it."""
        if owner not in self.models:
            return cst.Name(self.parameter)
        args = [cst.Arg(cst.Name("self")), cst.Arg(cst.SimpleString(f'"{self.models[owner].shared}"')),
                cst.Arg(cst.SimpleString(f'"{self.weight}"'))]
        if self._optional(owner):
            args.append(cst.Arg(cst.Name(self.parameter)))
        return cst.Call(self._runtime("shared_weight"), args)

    def _is_weight(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Name):
            return node.value == self.parameter
        return isinstance(node, cst.Call) and f"{self.runtime}.shared_weight" in self.qualified_names(node)

    # -- the pass ---------------------------------------------------------------------------------------
    def focus(self) -> Iterable[cst.CSTNode]:
        targets = [s for s in self.module.body if isinstance(s, cst.ClassDef) and s.name.value in self.forwards]
        present = {s.name.value for s in targets}
        missing = sorted(set(self.forwards) - present)
        # An excerpt may hold only some classes; but a present class that would pass the weight
        # into a missing one would call a forward that does not take it.
        for owner in sorted(present):
            for call, target in self.forwards[owner].calls.items():
                if target in missing:
                    raise TransformError(f"{owner}.forward calls {call}, which runs {target}: "
                                         f"no class {target} in the module")
        if missing:
            self.warn(f"shared_weight: no class {', '.join(missing)} in the module")
        return targets

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._class.append(node.name.value)
        self._found = set()
        return node.name.value in self.forwards

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value != "forward" or self._in_forward:
            return False
        self._in_forward = True
        return True

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._in_forward:
            return updated_node
        owner = self._class[-1]
        spec, callee = self.forwards[owner], dotted_name(updated_node.func)
        if callee is not None and callee in spec.uses:
            self._found.add(callee)
            return cst.Call(self._runtime("call_shared"), [
                cst.Arg(updated_node.func), cst.Arg(self._weight_in(owner)), *updated_node.args])
        if callee == f"{self.runtime}.call_shared" and updated_node.args:
            self._found.add(dotted_name(updated_node.args[0].value) or "")  # a use rewritten before
            return updated_node
        target = spec.calls.get(callee or "")
        if target is None:
            return updated_node
        assert callee is not None
        self._found.add(callee)
        args = updated_node.args
        if self._optional(target):
            if any(arg.keyword is not None and arg.keyword.value == self.parameter for arg in args):
                return updated_node
            passed = cst.Arg(self._weight_in(owner), keyword=cst.Name(self.parameter),
                             equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            return updated_node.with_changes(args=append_item(args, passed))
        if args and args[0].keyword is None and not args[0].star and self._is_weight(args[0].value):
            return updated_node
        return updated_node.with_changes(args=[cst.Arg(self._weight_in(owner)), *args])

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not self._in_forward or original_node.name.value != "forward":
            return updated_node
        self._in_forward = False
        owner = self._class[-1]
        spec = self.forwards[owner]
        missing = [name for name in (*spec.calls, *spec.uses) if name not in self._found]
        if missing:
            raise TransformError(f"{owner}.forward has no call of {', '.join(missing)}")
        self._found.add("forward")
        params = updated_node.params
        if owner not in self.receivers or self.parameter in {p.name.value for p in all_params(params)}:
            return updated_node
        if self._optional(owner):
            new = cst.Param(cst.Name(self.parameter), default=cst.Name("None"),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            if isinstance(params.star_arg, cst.Param) or params.kwonly_params:
                return updated_node.with_changes(params=params.with_changes(
                    kwonly_params=append_item(params.kwonly_params, new)))
            return updated_node.with_changes(params=params.with_changes(params=append_item(params.params, new)))
        first = params.params
        if not first:
            raise TransformError(f"{owner}.forward takes no self parameter")
        new = cst.Param(cst.Name(self.parameter), comma=first[0].comma)
        return updated_node.with_changes(params=params.with_changes(params=[first[0], new, *first[1:]]))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        name = self._class.pop()
        if name not in self.forwards:
            return updated_node
        if "forward" not in self._found:
            raise TransformError(f"{name} has no forward method")
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
            shared="{spec.shared}",
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
