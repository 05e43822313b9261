"""Give tensor factories their size as one tuple instead of ``*size`` varargs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.base import Transform

FACTORIES = ("torch.ones", "torch.zeros", "torch.empty", "torch.rand", "torch.randn")


@dataclass(frozen=True)
class SizeVarargsOptions:
    functions: tuple[str, ...] = FACTORIES  # qualified names of the factories to rewrite


def _sizes(args: Sequence[cst.Arg]) -> int:
    """How many leading positional sizes a factory call passes (0 when it already passes one tuple)."""
    if any(arg.star == "*" for arg in args):
        return 0
    count = next((i for i, arg in enumerate(args) if arg.keyword is not None or arg.star), len(args))
    return 0 if count and isinstance(args[0].value, (cst.Tuple, cst.List)) else count


class SizeVarargs(Transform):
    """Pack the positional sizes of ``torch.ones``-style factories into one tuple.

    torch.fx replaces these factories while tracing with wrappers whose only
    positional parameter is the size, so the varargs spelling fails as soon as a
    size is a Proxy; the tuple spelling means the same thing eagerly and traces.
    Calls are matched by qualified name (option ``functions``, default: ones,
    zeros, empty, rand and randn of ``torch``), so aliases are found too; a
    call whose first positional argument is already a tuple or list, a starred
    call and a one-size call are left alone, as are ``Tensor.new_ones``-style
    methods::

        mask = torch.ones(batch, length, device=d)    # before
        mask = torch.ones((batch, length), device=d)  # after
    """

    DESCRIPTION = "torch.ones(a, b) and similar factories -> torch.ones((a, b))"

    Options = SizeVarargsOptions

    def __init__(self, context: CodemodContext, options: SizeVarargsOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.functions = frozenset(self.options.functions)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [call for call in self.index.nodes(cst.Call) if _sizes(call.args) >= 2
                and self.qualified_names(call) & self.functions]

    # Imports, annotations and strings never hold a factory call worth rewriting.
    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False

    def visit_SimpleString(self, node: cst.SimpleString) -> bool:
        return False

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> bool:
        return False

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        args = updated_node.args
        count = _sizes(args)
        if count < 2:
            return updated_node
        names = self.qualified_names(original_node)
        if not names & self.functions:
            return updated_node
        sizes, last = args[:count - 1], args[count - 1]
        # Each comma keeps its own whitespace, so multi-line calls keep their layout.
        elements = [cst.Element(value=arg.value, comma=arg.comma) for arg in sizes]
        elements.append(cst.Element(value=last.value))
        packed = cst.Arg(value=cst.Tuple(elements=elements), comma=last.comma,
                         whitespace_after_arg=last.whitespace_after_arg)
        return updated_node.with_changes(args=(packed, *args[count:]))
