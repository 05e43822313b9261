"""Slice assignment into a tensor -> a call of an fx leaf helper that does it and returns the tensor."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from common.schema import OptionError
from transforms.library.base import Transform
from transforms.library.leaf_helper import with_fx_wrap


@dataclass(frozen=True)
class ItemAssignmentOptions:
    helper: str = "stateless.setitem"  # module.function: f(target, index, value) -> target with target[index] = value

    def __post_init__(self) -> None:
        module, _, name = self.helper.rpartition(".")
        if not module or not name.isidentifier():
            raise OptionError("helper", f"{self.helper!r} is not a module.function")


def _index(elements: Sequence[cst.SubscriptElement]) -> cst.BaseExpression:
    """The object Python passes to ``__setitem__`` for ``x[<elements>]``, spelled out."""
    values: list[cst.BaseExpression] = []
    for element in elements:
        part = element.slice
        if isinstance(part, cst.Index):
            values.append(part.value)
        else:
            assert isinstance(part, cst.Slice)
            bounds = [part.lower, part.upper] + ([part.step] if part.step is not None else [])
            values.append(cst.Call(cst.Name("slice"), [cst.Arg(b if b is not None else cst.Name("None"))
                                                       for b in bounds]))
    if len(values) == 1 and not isinstance(elements[0].comma, cst.Comma):
        return values[0]
    return cst.Tuple([cst.Element(v) for v in values])


class ItemAssignment(Transform):
    """``x[..., :n] = v`` in a method -> ``x = setitem(x, (..., slice(None, n)), v)``, an fx leaf.

    ``symbolic_trace`` cannot record an assignment into a Proxy ("'Proxy' object
    does not support item assignment").  The helper returns a new tensor holding
    the assignment's result (out of place, the same bits and gradients) and the
    name is rebound to it, so the update is a value the rest of the method
    uses: a tracer that keeps only what the output is computed from (FTPipe's)
    would drop an in-place assignment.  fx records one call (a leaf),
    torch.export and FTPipe trace through it.  Other aliases of the old tensor
    (views of it, the caller's argument) no longer see the update: a recipe
    applies the transform where the target is a local copy, as in T5's
    ``_prepare_4d_causal_attention_mask_with_cache_position`` (``clone()``
    first).  Only assignments whose subscript slices (a ``:`` or ``...``) a
    local variable of a method are rewritten: those are tensor updates, not
    dictionary entries.  Option ``helper`` names the function (default
    ``stateless.setitem``)::

        causal_mask[:, :, :, :mask_length] = causal_mask[:, :, :, :mask_length].masked_fill(pad, low)   # before
        causal_mask = setitem(causal_mask, (slice(None, None), slice(None, None), slice(None, None),
                                            slice(None, mask_length)),
                              causal_mask[:, :, :, :mask_length].masked_fill(pad, low))                   # after
    """

    DESCRIPTION = "x[<slices>] = v in a method -> x = setitem(x, <index>, v), an fx leaf"
    Options = ItemAssignmentOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        found = []
        for target in self.index.nodes(cst.AssignTarget):
            subscript = target.target
            if not (isinstance(subscript, cst.Subscript) and isinstance(subscript.value, cst.Name)):
                continue
            if not any(isinstance(e.slice, cst.Slice) or (isinstance(e.slice, cst.Index)
                                                          and isinstance(e.slice.value, cst.Ellipsis))
                       for e in subscript.slice):
                continue
            assign = self.index.parent(target)
            line = self.index.parent(assign) if assign is not None else None
            if isinstance(assign, cst.Assign) and len(assign.targets) == 1 and self._in_method(target) \
                    and isinstance(line, cst.SimpleStatementLine):
                found.append(assign)
        self._targets = {id(node) for node in found}
        return found

    def _in_method(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, cst.ClassDef) for a in self.index.ancestors(node))

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if id(original_node) not in self._targets:
            return updated_node
        subscript = updated_node.targets[0].target
        assert isinstance(subscript, cst.Subscript) and isinstance(subscript.value, cst.Name)
        module, _, name = self.options.helper.rpartition(".")
        AddImportsVisitor.add_needed_import(self.context, module, name)
        call = cst.Call(cst.Name(name), [cst.Arg(subscript.value), cst.Arg(_index(subscript.slice)),
                                         cst.Arg(updated_node.value)])
        return updated_node.with_changes(targets=[cst.AssignTarget(subscript.value.deep_clone())], value=call)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._targets:
            return updated_node
        return with_fx_wrap(self, original_node, updated_node, self.options.helper.rpartition(".")[2])
