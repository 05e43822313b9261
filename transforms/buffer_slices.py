"""Slices of a registered buffer by traced sizes -> ``narrow`` calls tracers record."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext

from transforms.analysis.literals import is_literal
from transforms.library.base import Transform
from transforms.library.submodules import methods

_REGISTER = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("register_buffer")),
                   args=[m.Arg(value=m.SimpleString()), m.ZeroOrMore()])
# 5.x registers buffers by assignment: `self.name = nn.Buffer(...)`.
_ASSIGNED = m.Assign(targets=[m.AssignTarget(target=m.Attribute(value=m.Name(), attr=m.Name()))],
                     value=m.Call(func=m.Attribute(attr=m.Name("Buffer")) | m.Name("Buffer")))


def _buffer_names(node: cst.ClassDef) -> frozenset[str]:
    """The buffers a class registers, by ``register_buffer("name", ...)`` or ``self.name = nn.Buffer(...)``."""
    registered = {call.args[0].value.evaluated_value  # type: ignore[attr-defined]  # matched a SimpleString
                  for call in m.findall(node, _REGISTER) if isinstance(call, cst.Call)}
    assigned = {assign.targets[0].target.attr.value  # type: ignore[attr-defined]  # matched an Attribute
                for assign in m.findall(node, _ASSIGNED) if isinstance(assign, cst.Assign)}
    return frozenset(registered | assigned)


@dataclass(frozen=True)
class BufferSlicesOptions:
    # Module-level functions whose first parameter is a module of the file (GPT-2 4.51's
    # eager_attention_forward(module, ...)): its slices of any class's buffers are rewritten too.
    functions: tuple[str, ...] = ()


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer)):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _rooted_at(node: cst.BaseExpression, owner: str) -> bool:
    """Whether ``node`` is ``owner.a`` or ``owner.a.b``...: a submodule of the receiver."""
    while isinstance(node, cst.Attribute):
        node = node.value
        if m.matches(node, m.Name(owner)):
            return True
    return False


class BufferSlices(Transform):
    """``self.buf[:, :, a:b, :c]`` -> ``self.buf.narrow(2, a, b - a).narrow(3, 0, c)``.

    torch.fx does not proxy buffers: ``self.buf`` is the real tensor, and
    slicing a real tensor with traced bounds fails (``slice indices must be
    integers``).  ``narrow`` is a tensor method, so a traced bound makes fx
    record the call, with the buffer as a ``get_attr`` of its module; torch.export
    traces either form.  Buffers are found by their ``register_buffer`` call (5.x: their
    ``self.name = nn.Buffer(...)`` assignment) in the same class, or (``self.sub.buf``, a submodule's) in any class of the
    file; only subscripts made of plain slices (no step) with some non-literal
    bound are rewritten.  The bounds are sizes: ``narrow`` and
    slicing agree for ``0 <= start <= stop <= size``, where GPT-2's causal mask
    slice lives (``self.bias[:, :, ns - nd : ns, :ns]``); out of that range
    slicing clamps, while ``narrow`` raises::

        mask = self.bias[:, :, ns - nd : ns, :ns]                                  # before
        mask = self.bias.narrow(2, ns - nd, ns - (ns - nd)).narrow(3, 0, ns)       # after

        ids = self.embeddings.token_type_ids[:, :seq_length]                       # before (BERT 4.10)
        ids = self.embeddings.token_type_ids.narrow(1, 0, seq_length)              # after

    Option ``functions``: module-level functions that take the module as their first
    parameter (HF's attention functions from 4.48 on); the buffers they slice are those
    of any class in the file::

        def eager_attention_forward(module, query, key, value, attention_mask):    # before (GPT-2 4.51)
            causal_mask = module.bias[:, :, kl - ql : kl, :kl]
        def eager_attention_forward(module, query, key, value, attention_mask):    # after
            causal_mask = module.bias.narrow(2, kl - ql, kl - (kl - ql)).narrow(3, 0, kl)
    """

    DESCRIPTION = "slices of a registered buffer by traced sizes -> narrow"
    Options = BufferSlicesOptions

    def __init__(self, context: CodemodContext, options: BufferSlicesOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        # id of a method -> (receiver, its class's buffer names, every class's buffer names)
        self._buffers: dict[int, tuple[str, frozenset[str], frozenset[str]]] = {}
        self._method: list[tuple[str, frozenset[str], frozenset[str]] | None] = []

    def focus(self) -> Iterable[cst.CSTNode]:
        found: list[cst.CSTNode] = []
        classes = {id(node): _buffer_names(node) for node in self.index.nodes(cst.ClassDef)}
        anywhere = frozenset().union(*classes.values())
        if not anywhere:
            return found
        candidates = [(method, (owner, classes[id(node)], anywhere))
                      for node in self.index.nodes(cst.ClassDef) for _, method, owner in methods(node)]
        candidates += [(function, (function.params.params[0].name.value, anywhere, anywhere))
                       for function in self.index.module.body if isinstance(function, cst.FunctionDef)
                       and function.name.value in self.options.functions and function.params.params]
        for function, context in candidates:
            if any(self._slices(s, *context) for s in m.findall(function, m.Subscript())
                   if isinstance(s, cst.Subscript)):
                self._buffers[id(function)] = context
                found.append(function)
        return found

    @staticmethod
    def _slices(node: cst.Subscript, owner: str, buffers: frozenset[str], anywhere: frozenset[str]) -> bool:
        """Whether ``node`` slices ``self.buf`` (``buffers``) or ``self.sub.buf`` (``anywhere``) with plain
        slices, some bound not a literal."""
        value = node.value
        if not isinstance(value, cst.Attribute):
            return False
        if m.matches(value.value, m.Name(owner)):
            if value.attr.value not in buffers:
                return False
        elif not (_rooted_at(value.value, owner) and value.attr.value in anywhere):
            return False
        parts = [element.slice for element in node.slice]
        if not all(isinstance(p, cst.Slice) and p.step is None for p in parts):
            return False
        bounds = [b for p in parts if isinstance(p, cst.Slice) for b in (p.lower, p.upper) if b is not None]
        return any(not is_literal(b) for b in bounds)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._method.append(self._buffers.get(id(node)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._method.pop()
        return updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        context = self._method[-1] if self._method else None
        if context is None or not self._slices(updated_node, *context):
            return updated_node
        result: cst.BaseExpression = updated_node.value
        for dim, element in enumerate(updated_node.slice):
            part = element.slice
            assert isinstance(part, cst.Slice)
            lower, upper = part.lower, part.upper
            if lower is None and upper is None:
                continue
            start = lower if lower is not None else cst.Integer("0")
            if upper is None:
                size = cst.Call(cst.Attribute(updated_node.value, cst.Name("size")), [cst.Arg(cst.Integer(str(dim)))])
                length: cst.BaseExpression = cst.BinaryOperation(size, cst.Subtract(), _parenthesized(start))
            elif lower is None:
                length = upper
            else:
                length = cst.BinaryOperation(_parenthesized(upper), cst.Subtract(), _parenthesized(lower))
            result = cst.Call(cst.Attribute(result, cst.Name("narrow")),
                              [cst.Arg(cst.Integer(str(dim))), cst.Arg(start), cst.Arg(length)])
        return result.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
