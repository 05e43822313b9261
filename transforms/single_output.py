"""Make a model's forward return one value, chosen by the recipe."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext

from common.schema import OptionError
from transforms.analysis.liveness import Liveness
from transforms.analysis.names import bound_names, names_read
from transforms.analysis.syntax import all_params, append_item, descendants, dotted_name, indented
from transforms.library.base import Transform, TransformError
from transforms.library.specialize_options import expression_option


@dataclass(frozen=True)
class NestedOptions:
    """A class of ``returns`` that other classes call for more than its one value."""

    returns: str  # what it returns to them: an expression over names its method binds
    callers: dict[str, str]  # calling class -> the call in its method that asks for it (`self.bert`)

    def __post_init__(self) -> None:
        expression_option("returns", self.returns)
        if not self.callers:
            raise OptionError("callers", "name at least one calling class")


@dataclass(frozen=True)
class SingleOutputOptions:
    returns: dict[str, str]  # class name -> the expression its method returns
    method: str = "forward"
    # class name -> {call: index}: its method reads item `index` of what the call (`self.transformer`)
    # returned, and that call now returns that one item (a model of `returns` used inside another); a
    # string names an attribute instead (`outputs.last_hidden_state` of a ModelOutput).
    items: dict[str, dict[str, int | str]] = field(default_factory=dict)
    # class name -> what it returns to the classes that call it for more than one value (BERT's base model,
    # whose pooled output the pre-training heads read); they pass `flag=True`.
    nested: dict[str, NestedOptions] = field(default_factory=dict)
    flag: str = "return_tuple"  # the keyword parameter that asks for the nested value

    def __post_init__(self) -> None:
        for name, text in self.returns.items():
            expression_option(f"returns.{name}", text)
        for name, spec in self.nested.items():
            if name not in self.returns:
                raise OptionError(f"nested.{name}", f"{name} has no single value in returns to nest")
            for caller, call in spec.callers.items():
                if call in self.items.get(caller, {}):
                    raise OptionError(f"nested.{name}.callers.{caller}",
                                      f"{call} is read as one item (items.{caller}) and asks for the nested value")


class SingleOutput(Transform):
    """Replace every ``return`` of ``forward`` in the named classes by one expression.

    Pipeline partitioners (FTPipe, torch.distributed.pipelining's last stage)
    want one output tensor, not HF's tuple or ``ModelOutput``.  The recipe maps a
    class to an expression over names ``forward`` binds, e.g. the loss when labels
    are given, else the logits::

        def forward(self, input_ids, labels=None):          # before
            ...
            if not return_dict:
                return ((loss,) + output) if loss is not None else output
            return Seq2SeqLMOutput(loss=loss, logits=lm_logits)

        def forward(self, input_ids, labels=None):          # after
            ...
            if not return_dict:
                return loss if labels is not None else lm_logits
            return loss if labels is not None else lm_logits

    A model whose output became one value may be called by another (GPT-2's
    ``GPT2Model`` inside ``GPT2LMHeadModel``): option ``items`` names, per
    calling class, the call and the item of its old result that the one value
    is, and the caller reads the value itself::

        transformer_outputs = self.transformer(input_ids)   # before
        hidden_states = transformer_outputs[0]

        transformer_outputs = self.transformer(input_ids)   # after (items: "self.transformer" = 0)
        hidden_states = transformer_outputs

    An item named by a string is an attribute: ``outputs.last_hidden_state`` ->
    ``outputs`` (items: ``"self.model" = "last_hidden_state"``).

    A model that other models call for more than its one value (BERT's
    ``BertModel``, whose pooled output ``BertForPreTraining`` reads) gets a
    keyword parameter, ``flag`` (default ``return_tuple``), that asks for the
    value option ``nested`` names; the calling classes pass it.  A plain Python
    flag: every tracer sees a constant::

        def forward(self, input_ids):                        # after (nested: returns = "(seq, pooled)")
            ...
            return (seq, pooled) if return_tuple else seq    # forward(self, input_ids, return_tuple=None)
        outputs = self.bert(input_ids, return_tuple=True)    # in the caller

    Run it before argument specialization, which then folds the branches and
    drops what only fed the old return values.
    """

    DESCRIPTION = "forward returns the one value the recipe names"

    Options = SingleOutputOptions

    def __init__(self, context: CodemodContext, options: SingleOutputOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.returns = {cls: cst.parse_expression(text) for cls, text in self.options.returns.items()}
        self.method = self.options.method
        self._classes: list[str] = []
        self._asks: dict[str, list[str]] = {}  # calling class -> its calls that ask for a nested value
        for spec in self.options.nested.values():
            for caller, call in spec.callers.items():
                self._asks.setdefault(caller, []).append(call)

    def _touches(self, name: str) -> bool:
        return name in self.returns or name in self.options.items or name in self._asks

    def focus(self) -> Iterable[cst.CSTNode]:
        return [cls for cls in self.module.body if isinstance(cls, cst.ClassDef) and self._touches(cls.name.value)]

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._classes.append(node.name.value)
        return self._touches(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # the returns are replaced from leave_FunctionDef

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._classes.pop()
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not self._classes or updated_node.name.value != self.method:
            return updated_node
        value = self.returns.get(self._classes[-1])
        nested = self.options.nested.get(self._classes[-1])
        if value is not None:
            if nested is not None:
                updated_node = self._with_flag(updated_node)
                value = cst.IfExp(test=cst.Name(self.options.flag), body=cst.parse_expression(nested.returns),
                                  orelse=value)
            updated_node = self._replace_returns(updated_node, value)
        items = self.options.items.get(self._classes[-1])
        if items:  # after the returns: the old ones read other items of the result
            updated_node = self._read_items(updated_node, items)
        asks = self._asks.get(self._classes[-1])
        if asks:
            updated_node = self._ask(updated_node, asks)
        return updated_node

    def _with_flag(self, function: cst.FunctionDef) -> cst.FunctionDef:
        """``function`` taking ``flag=None`` last (keyword-only after ``*args``).

        None, not False: tracing tools pass None for every optional input a call leaves out
        (``concrete_args``), and a GraphModule asserts that value on every later call.
        """
        params, flag = function.params, self.options.flag
        if flag in {p.name.value for p in all_params(params)}:
            return function
        new = cst.Param(cst.Name(flag), default=cst.Name("None"),
                        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        if isinstance(params.star_arg, cst.Param) or params.kwonly_params or params.star_kwarg is not None:
            if not isinstance(params.star_arg, cst.Param) and not params.kwonly_params:
                raise TransformError(f"{self._classes[-1]}.{self.method} takes **kwargs only: "
                                     f"no place for the {flag} parameter")
            return function.with_changes(params=params.with_changes(
                kwonly_params=append_item(params.kwonly_params, new)))
        return function.with_changes(params=params.with_changes(params=append_item(params.params, new)))

    def _ask(self, function: cst.FunctionDef, calls: list[str]) -> cst.FunctionDef:
        """``function`` passing ``flag=True`` to each of ``calls``."""
        found: set[str] = set()
        flag = self.options.flag

        class Asker(cst.CSTTransformer):
            def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
                callee = dotted_name(updated_node.func)
                if callee not in calls:
                    return updated_node
                found.add(callee)
                if any(arg.keyword is not None and arg.keyword.value == flag for arg in updated_node.args):
                    return updated_node
                asked = cst.Arg(cst.Name("True"), keyword=cst.Name(flag),
                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
                return updated_node.with_changes(args=append_item(updated_node.args, asked))

        body = function.body.visit(Asker())
        missing = sorted(set(calls) - found)
        if missing:
            raise TransformError(f"{self._classes[-1]}.{self.method} has no call of {', '.join(missing)}")
        assert isinstance(body, cst.BaseSuite)
        return function.with_changes(body=body)

    def _replace_returns(self, function: cst.FunctionDef, value: cst.BaseExpression) -> cst.FunctionDef:
        bound = {p.name.value for p in all_params(function.params)}
        bound |= bound_names(function.body)
        missing = sorted(names_read(value) - bound - {"self"})
        if missing:
            raise TransformError(f"{self._classes[-1]}.{self.method} does not bind "
                                 f"{', '.join(missing)} used by its recipe return value")
        body = function.body.visit(_ReturnReplacer(value))
        if isinstance(body, cst.IndentedBlock) and isinstance(function.body, cst.IndentedBlock):
            # What fed only the old return values is dead now: drop it where that loses no effect.
            liveness = Liveness(frozenset())
            fed_returns = liveness.live(function.body.body)
            body = indented(liveness.remove_dead(body.body, fed_returns), body)
        return function.with_changes(body=body)

    def _read_items(self, function: cst.FunctionDef, items: dict[str, int | str]) -> cst.FunctionDef:
        """``function`` reading the one value of each call in ``items`` where it read that item."""
        where = f"{self._classes[-1]}.{self.method}"
        found = {call for call in items if any(isinstance(n, cst.Call) and dotted_name(n.func) == call
                                               for n in descendants(function.body))}
        if len(found) < len(items):
            raise TransformError(f"{where} has no call of {', '.join(sorted(set(items) - found))}")
        locals_: dict[str, int | str] = {}  # a local bound to a call's whole result -> the item read
        for node in descendants(function.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1:
                target: cst.BaseExpression | None = node.targets[0].target
            elif isinstance(node, cst.AnnAssign):  # `outputs: BaseModelOutputWithPast = self.model(...)`
                target = node.target
            else:
                continue
            if isinstance(node.value, cst.Call) and isinstance(target, cst.Name) \
                    and dotted_name(node.value.func) in items:
                locals_[target.value] = items[dotted_name(node.value.func) or ""]
        rewritten = function.body.visit(_ItemReader(items, locals_))
        assert isinstance(rewritten, cst.BaseSuite)
        # A read of another item or of an attribute needs the old result (a bare read is the value itself).
        for read in descendants(rewritten):
            if isinstance(read, (cst.Subscript, cst.Attribute)) and isinstance(read.value, cst.Name) \
                    and read.value.value in locals_:
                name = read.value.value
                raise TransformError(f"{where} reads {name} other than as item {locals_[name]!r}: "
                                     f"it cannot take the one value instead")
        return function.with_changes(body=rewritten)


class _ItemReader(cst.CSTTransformer):
    """``x[i]`` (``x.name``) -> ``x`` for a local bound to a listed call (``call(...)[i]`` -> ``call(...)``)."""

    def __init__(self, items: dict[str, int | str], locals_: dict[str, int | str]) -> None:
        self.items, self.locals = items, locals_

    def _item(self, value: cst.BaseExpression) -> int | str | None:
        if isinstance(value, cst.Name):
            return self.locals.get(value.value)
        if isinstance(value, cst.Call):
            return self.items.get(dotted_name(value.func) or "")
        return None

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        value = updated_node.value
        if self._item(value) != updated_node.attr.value:
            return updated_node
        return value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        value = updated_node.value
        index = self._item(value)
        if not isinstance(index, int) or len(updated_node.slice) != 1:
            return updated_node
        item = updated_node.slice[0].slice
        if not (isinstance(item, cst.Index) and isinstance(item.value, cst.Integer)
                and int(item.value.value) == index):
            return updated_node
        return value.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)


class _ReturnReplacer(cst.CSTTransformer):
    def __init__(self, value: cst.BaseExpression) -> None:
        self.value = value

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False  # a nested function's returns are its own

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        if updated_node.value is not None and updated_node.value.deep_equals(self.value):
            return updated_node
        return updated_node.with_changes(value=self.value.deep_clone(),
                                         whitespace_after_return=cst.SimpleWhitespace(" "))
