"""An in-place tensor method called for its effect on a local -> the out-of-place method, assigned back."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from transforms.analysis.syntax import code_of
from transforms.library.base import Transform

# Functions and methods whose result is a tensor of its own (never a view or one of the arguments).
_FRESH_FUNCTIONS = frozenset(f"torch.{name}" for name in (
    "cat", "concat", "stack", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "empty", "empty_like",
    "arange", "tensor", "where", "clone", "rand", "randn", "randint"))
_FRESH_METHODS = frozenset(("clone", "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"))
# Reads of a tensor that give no tensor sharing its memory.
_METADATA = frozenset(("shape", "dtype", "device", "ndim", "is_cuda", "requires_grad"))
_METADATA_METHODS = frozenset(("size", "dim", "numel", "nelement", "element_size", "is_floating_point"))
_LOOPS = (cst.For, cst.While)


@dataclass(frozen=True)
class OutOfPlaceOptions:
    # In-place methods whose out-of-place form (the name without "_") returns exactly the tensor the in-place
    # call leaves: the receiver's dtype and shape.  Not add_ and its kind: out of place they promote dtypes.
    methods: tuple[str, ...] = ("masked_fill_", "index_fill_")


class OutOfPlace(Transform):
    """``x.masked_fill_(m, v)`` as a statement -> ``x = x.masked_fill(m, v)``, where that changes nothing.

    FTPipe's tracer keeps only the operations the output is computed from: an
    in-place call whose result is unused is discarded, and later reads of the
    tensor read it as it was before (BART's causal mask stays ``-inf``
    everywhere: every output is NaN; a shifted decoder input keeps its
    ``-100`` labels: the embedding raises ``IndexError``).  Assigned back, the
    result is used.  The two forms compute the same tensor; they differ only
    for other references to the old one, so a call is rewritten only where
    none can exist: ``x`` is a variable of the function (not a parameter, not
    read by a nested scope), bound before the call, outside any branch the call
    is not in, to a tensor of its own (a ``torch`` creation or joining
    function, ``clone``/``new_*``, an arithmetic result), and between that
    binding and the call read only for its metadata (``x.size()``,
    ``x.dtype``), as an operand (``x == -100``) or by another such call; the
    call is not in a loop.  Any other case is left as it is, with a warning::

        mask = torch.full((tgt_len, tgt_len), float("-inf"))
        mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)           # before
        mask = mask.masked_fill(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)     # after

    Option ``methods``: the in-place methods rewritten (default
    ``["masked_fill_", "index_fill_"]``); each one's out-of-place form must
    return the receiver's dtype and shape.
    """

    DESCRIPTION = "in-place tensor method as a statement on a local -> its out-of-place form, assigned back"
    Options = OutOfPlaceOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        self._rewrite: set[int] = set()
        for statement in self.index.nodes(cst.Expr):
            call = statement.value
            if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                    and call.func.attr.value in self.options.methods):
                continue
            reason = self._unsafe(statement, call.func.value)
            if reason is None:
                self._rewrite.add(id(statement))
            else:
                self.report(statement, f"{code_of(call.func)}(...) left in place: {reason}")
        return [node for node in self.index.nodes(cst.Expr) if id(node) in self._rewrite]

    def _unsafe(self, statement: cst.Expr, receiver: cst.BaseExpression) -> str | None:
        """Why rewriting ``statement`` could change what the function computes, or None."""
        index = self.index
        if not isinstance(receiver, cst.Name):
            return f"{code_of(receiver)} is not a variable of the function"
        name = receiver.value
        scope = index.lookup(index.scope_of(receiver), name)
        if scope is None or scope is not index.scope_of(receiver) or not isinstance(scope.node, cst.FunctionDef):
            return f"{name} is not a variable of the function"
        bindings, reads = index.local_uses(receiver)
        if any(isinstance(binding, cst.Param) for binding in bindings):
            return f"{name} is a parameter: the caller's tensor would no longer change"
        if any(index.scope_of(read) is not scope for read in reads):
            return f"{name} is read by a nested scope"
        line = index.enclosing(statement, cst.SimpleStatementLine)
        assert line is not None
        inside = list(index.ancestors(line))
        if any(isinstance(node, _LOOPS) for node in inside[:inside.index(scope.node)]):
            return "it is inside a loop"
        position = index.statement_position(line)
        earlier = [b for b in bindings if index.statement_position(b) < position]
        if not earlier:
            return f"{name} is not bound before it"
        binding = max(earlier, key=index.statement_position)
        target = index.parent(binding)
        assign = index.parent(target) if isinstance(target, cst.AssignTarget) else None
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return f"{name} is not bound by a plain assignment before it"
        block = index.parent(index.parent(assign) or assign)  # the block holding the assignment's line
        if not any(block is node for node in inside):
            return f"{name} may be bound in a branch the call is not in"
        if not self._fresh(assign.value):
            return f"{name} may share memory with another tensor ({code_of(assign.value)})"
        bound_at = index.statement_position(assign)
        for read in reads:
            if bound_at < index.statement_position(read) <= position and not self._harmless(read):
                return f"{name} may be aliased by {code_of(index.enclosing(read, cst.SimpleStatementLine) or read).strip()}"
        return None

    def _fresh(self, value: cst.BaseExpression) -> bool:
        """Whether ``value`` is a tensor of its own."""
        if isinstance(value, (cst.BinaryOperation, cst.Comparison)):
            return True
        if isinstance(value, cst.UnaryOperation):
            return not isinstance(value.operator, cst.Not)
        if not isinstance(value, cst.Call):
            return False
        names = self.qualified_names(value)
        if names and names <= _FRESH_FUNCTIONS:
            return True
        out_of_place = {method[:-1] for method in self.options.methods}
        return isinstance(value.func, cst.Attribute) and value.func.attr.value in _FRESH_METHODS | out_of_place

    def _harmless(self, read: cst.Name) -> bool:
        """Whether this read of the tensor gives nothing that shares its memory."""
        parent = self.index.parent(read)
        if isinstance(parent, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget)):
            return True
        if not (isinstance(parent, cst.Attribute) and parent.value is read):
            return False
        attr = parent.attr.value
        call = self.index.parent(parent)
        if isinstance(call, cst.Call) and call.func is parent:
            called_for_effect = isinstance(self.index.parent(call), cst.Expr) and attr in self.options.methods
            return attr in _METADATA_METHODS or called_for_effect
        return attr in _METADATA

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr) -> cst.Expr | cst.Assign:
        if id(original_node) not in self._rewrite:
            return updated_node
        call = updated_node.value
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        assert isinstance(call.func.value, cst.Name)  # focus() rewrites only calls on a variable
        method = call.func.attr.value[:-1]
        value = call.with_changes(func=call.func.with_changes(attr=cst.Name(method)))
        return cst.Assign([cst.AssignTarget(call.func.value)], value, semicolon=updated_node.semicolon)
