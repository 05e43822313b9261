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
    # Tensor methods taking a size either as varargs or as one sequence (view, reshape, ...):
    # ``x.view(*shape)`` becomes ``x.view(shape)``.  Matched by method name (the receiver's type is
    # unknown to a rewrite), so only what the recipe lists.
    methods: tuple[str, ...] = ()


def _unpacked(call: cst.Call, methods: frozenset[str]) -> bool:
    """``x.<method>(*size)``: one starred argument and nothing else, to a listed method."""
    return (isinstance(call.func, cst.Attribute) and call.func.attr.value in methods and len(call.args) == 1
            and call.args[0].star == "*")


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

    The same holds for a size star-unpacked into a tensor method (unpacking
    iterates a Proxy, which fx refuses); option ``methods`` lists the methods
    that take the size as one sequence as well::

        x = x.view(*new_shape)                         # before
        x = x.view(new_shape)                          # after
    """

    DESCRIPTION = "torch.ones(a, b) and similar factories -> torch.ones((a, b)); x.view(*s) -> x.view(s)"

    Options = SizeVarargsOptions

    def __init__(self, context: CodemodContext, options: SizeVarargsOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.functions = frozenset(self.options.functions)
        self.methods = frozenset(self.options.methods)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [call for call in self.index.nodes(cst.Call) if _unpacked(call, self.methods) or (
            _sizes(call.args) >= 2 and self.qualified_names(call) & self.functions)]

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
        if _unpacked(updated_node, self.methods):
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(star="")])
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
