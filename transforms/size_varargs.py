"""Give tensor factories their size as one tuple instead of ``*size`` varargs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext

from transforms.library.base import Transform

FACTORIES = ("torch.ones", "torch.zeros", "torch.empty", "torch.rand", "torch.randn")


@dataclass(frozen=True)
class SizeVarargsOptions:
    functions: tuple[str, ...] = FACTORIES  # qualified names of the factories to rewrite
    # Tensor methods taking a size either as varargs or as one sequence (view, reshape, ...):
    # ``x.view(*shape)`` becomes ``x.view(shape)``.  Matched by method name (the receiver's type is
    # unknown to a rewrite), so only what the recipe lists.
    methods: tuple[str, ...] = ()
    # Tensor methods whose positional sizes are packed into one tuple, as the factories' are
    # (``x.expand(b, -1, 1)`` -> ``x.expand((b, -1, 1))``): fx fails on the varargs spelling when the
    # receiver is a real tensor (a buffer) and a size a Proxy.  Matched by method name too.
    sized_methods: tuple[str, ...] = ()


def _unpacked(call: cst.Call, methods: frozenset[str]) -> bool:
    """``x.<method>(*size)``: one starred argument and nothing else, to a listed method."""
    return (isinstance(call.func, cst.Attribute) and call.func.attr.value in methods and len(call.args) == 1
            and call.args[0].star == "*")


def _shape_of_a_tensor(node: cst.BaseExpression) -> bool:
    """``x.shape`` or ``x.size()``, or a slice of one (``x.shape[:-1]``): a ``torch.Size``."""
    if isinstance(node, cst.Subscript):
        return (all(isinstance(element.slice, cst.Slice) for element in node.slice)
                and _shape_of_a_tensor(node.value))
    if isinstance(node, cst.Call):
        return not node.args and m.matches(node.func, m.Attribute(attr=m.Name("size")))
    return m.matches(node, m.Attribute(attr=m.Name("shape")))


# Parents a concatenation stands in as a whole value.
_WHOLE_VALUE = (cst.Assign, cst.AnnAssign, cst.Return, cst.Arg, cst.Element)


def _concatenated(parts: list[cst.BaseExpression | list[cst.BaseExpression]]) -> cst.BaseExpression:
    """``a + (b, c) + d`` from shapes (expressions) and runs of single sizes (lists)."""
    terms = [cst.Tuple([cst.Element(v) for v in part]) if isinstance(part, list) else part for part in parts]
    result = terms[0]
    for term in terms[1:]:
        result = cst.BinaryOperation(result, cst.Add(), term)
    return result


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

    Option ``sized_methods`` lists methods whose positional sizes are packed
    like a factory's::

        f = self.inv_freq[None, :, None].expand(ids.shape[0], -1, 1)     # before
        f = self.inv_freq[None, :, None].expand((ids.shape[0], -1, 1))   # after

    A tensor's shape star-unpacked into a longer size (transformers 5.x) is
    concatenated instead: a ``torch.Size`` plus a tuple is the same size, and
    fx records the addition.  Only what is surely a shape is rewritten:
    ``x.shape``, ``x.size()``, slices of them, and a local name bound once to
    one of these::

        shape = (*states.shape[:-1], -1, d)            # before
        shape = states.shape[:-1] + (-1, d)            # after
        out = out.reshape(*input_shape, -1)            # before (input_shape = x.shape[:-1])
        out = out.reshape(input_shape + (-1,))         # after ("reshape" in methods)
    """

    DESCRIPTION = ("torch.ones(a, b) and similar factories -> torch.ones((a, b)); x.view(*s) -> x.view(s); "
                   "(*x.shape[:-1], d) -> x.shape[:-1] + (d,)")

    Options = SizeVarargsOptions

    def __init__(self, context: CodemodContext, options: SizeVarargsOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.functions = frozenset(self.options.functions)
        self.methods = frozenset(self.options.methods)
        self.sized_methods = frozenset(self.options.sized_methods)

    def focus(self) -> Iterable[cst.CSTNode]:
        calls = [call for call in self.index.nodes(cst.Call) if _unpacked(call, self.methods) or (
            _sizes(call.args) >= 2 and self._sized(call)) or self._shaped_call(call)]
        return [*calls, *(node for node in self.index.nodes(cst.Tuple) if self._shaped_tuple(node))]

    def _sized(self, call: cst.Call) -> bool:
        """A listed factory, or a call of a listed method (whose arguments are all sizes)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in self.sized_methods:
            return True
        return bool(self.qualified_names(call) & self.functions)

    def _is_shape(self, node: cst.BaseExpression) -> bool:
        """A ``torch.Size``: a tensor's shape, or a local name bound once, to one, in plain assignment."""
        if _shape_of_a_tensor(node):
            return True
        if not isinstance(node, cst.Name) or id(node) not in self.index.scopes:
            return False
        bindings, _ = self.index.local_uses(node)
        if len(bindings) != 1 or not isinstance(bindings[0], cst.Name):
            return False
        target = self.index.parent(bindings[0])
        assignment = self.index.parent(target) if isinstance(target, cst.AssignTarget) else None
        return (isinstance(assignment, cst.Assign) and len(assignment.targets) == 1
                and _shape_of_a_tensor(assignment.value))

    def _starred_shapes(self, values: Sequence[tuple[bool, cst.BaseExpression]]) -> bool:
        """Whether ``(starred, value)`` items star-unpack at least one shape, and nothing but shapes."""
        starred = [value for is_starred, value in values if is_starred]
        return bool(starred) and all(self._is_shape(value) for value in starred)

    def _shaped_tuple(self, node: cst.Tuple) -> bool:
        return self._starred_shapes([(isinstance(e, cst.StarredElement), e.value) for e in node.elements])

    def _shaped_call(self, call: cst.Call) -> bool:
        """``x.<method>(*shape, size...)``: positional sizes only, at least one more than the shape."""
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in self.methods and len(call.args) > 1):
            return False
        if any(arg.keyword is not None or arg.star == "**" for arg in call.args):
            return False
        return self._starred_shapes([(arg.star == "*", arg.value) for arg in call.args])

    @staticmethod
    def _parts(items: Sequence[tuple[bool, cst.BaseExpression]]) -> list[cst.BaseExpression | list[cst.BaseExpression]]:
        parts: list[cst.BaseExpression | list[cst.BaseExpression]] = []
        for is_starred, value in items:
            if is_starred:
                parts.append(value)
            elif parts and isinstance(parts[-1], list):
                parts[-1].append(value)
            else:
                parts.append([value])
        return parts

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.BaseExpression:
        if not self._shaped_tuple(original_node):
            return updated_node
        result = _concatenated(self._parts([(isinstance(e, cst.StarredElement), e.value)
                                            for e in updated_node.elements]))
        # Where the display was a whole value the sum needs no parentheses; elsewhere (an operand, a
        # subscripted value) the display's own keep it one operand.
        if not updated_node.lpar or isinstance(self.index.parent(original_node), _WHOLE_VALUE):
            return result
        return result.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

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
        if self._shaped_call(original_node):
            size = _concatenated(self._parts([(arg.star == "*", arg.value) for arg in updated_node.args]))
            return updated_node.with_changes(args=[cst.Arg(size)])
        if _unpacked(updated_node, self.methods):
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(star="")])
        args = updated_node.args
        count = _sizes(args)
        if count < 2:
            return updated_node
        if not self._sized(original_node):
            return updated_node
        sizes, last = args[:count - 1], args[count - 1]
        # Each comma keeps its own whitespace, so multi-line calls keep their layout.
        elements = [cst.Element(value=arg.value, comma=arg.comma) for arg in sizes]
        elements.append(cst.Element(value=last.value))
        packed = cst.Arg(value=cst.Tuple(elements=elements), comma=last.comma,
                         whitespace_after_arg=last.whitespace_after_arg)
        return updated_node.with_changes(args=(packed, *args[count:]))
