"""Turn ``assert`` statements in traced methods into ``torch._assert`` calls."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import code_of
from transforms.library.base import Transform


@dataclass(frozen=True)
class TorchAssertOptions:
    functions: tuple[str, ...] = ("forward",)  # the functions (methods) whose asserts are rewritten


class TorchAssert(Transform):
    """``assert cond, msg`` -> ``torch._assert(cond, msg)`` inside the named functions.

    An ``assert`` calls ``bool()`` on its condition: when the condition depends
    on a traced value (``batch_size > 0`` with ``batch_size = input_ids.shape[0]``,
    BART's ``attn_weights.size() == (...)``) torch.fx refuses it ("symbolically
    traced variables cannot be used as inputs to control flow").
    ``torch._assert`` checks the same condition eagerly, is recorded by fx and
    understood by torch.export; on a plain bool it is a plain assert.  An assert
    without a message gets its condition's source as the message::

        assert batch_size > 0, "batch_size has to be defined and > 0"            # before
        torch._assert(batch_size > 0, "batch_size has to be defined and > 0")   # after

    Option ``functions``: the functions (methods) whose asserts, nested blocks
    included, are rewritten (default ``["forward"]``).
    """

    DESCRIPTION = "assert in traced methods -> torch._assert"
    Options = TorchAssertOptions

    def __init__(self, context: CodemodContext, options: TorchAssertOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.functions = frozenset(self.options.functions)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [f for f in self.index.nodes(cst.FunctionDef) if f.name.value in self.functions]

    def leave_Assert(self, original_node: cst.Assert, updated_node: cst.Assert) -> cst.Expr:
        AddImportsVisitor.add_needed_import(self.context, "torch")
        message = updated_node.msg if updated_node.msg is not None else cst.SimpleString(
            repr(code_of(updated_node.test).strip()))
        call = cst.Call(cst.parse_expression("torch._assert"), [cst.Arg(updated_node.test), cst.Arg(message)])
        return cst.Expr(call, semicolon=updated_node.semicolon)
