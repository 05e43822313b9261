"""Make a model's forward return one value, chosen by the recipe."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.liveness import Liveness
from transforms.analysis.names import bound_names, names_read
from transforms.analysis.syntax import all_params, indented
from transforms.base import Transform, TransformError
from transforms.options import OptionError


@dataclass(frozen=True)
class SingleOutputOptions:
    returns: dict[str, str]  # class name -> the expression its method returns
    method: str = "forward"

    def __post_init__(self) -> None:
        for name, text in self.returns.items():
            try:
                cst.parse_expression(text)
            except cst.ParserSyntaxError:
                raise OptionError(f"returns.{name}", f"{text!r} is not an expression") from None


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

    def focus(self) -> Iterable[cst.CSTNode]:
        return [cls for cls in self.module.body if isinstance(cls, cst.ClassDef) and cls.name.value in self.returns]

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._classes.append(node.name.value)
        return node.name.value in self.returns

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
        if value is None:
            return updated_node
        params = updated_node.params
        bound = {p.name.value for p in all_params(params)}
        bound |= bound_names(updated_node.body)
        missing = sorted(names_read(value) - bound - {"self"})
        if missing:
            raise TransformError(f"{self._classes[-1]}.{self.method} does not bind "
                             f"{', '.join(missing)} used by its recipe return value")
        body = updated_node.body.visit(_ReturnReplacer(value))
        if isinstance(body, cst.IndentedBlock) and isinstance(updated_node.body, cst.IndentedBlock):
            # What fed only the old return values is dead now: drop it where that loses no effect.
            liveness = Liveness(frozenset())
            fed_returns = liveness.live(updated_node.body.body)
            body = indented(liveness.remove_dead(body.body, fed_returns), body)
        return updated_node.with_changes(body=body)


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
