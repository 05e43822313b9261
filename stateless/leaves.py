"""Operations symbolic tracing cannot record, as functions generated modules register with ``torch.fx.wrap``.

Where an argument is a Proxy, fx records one call of the function, made when the
graph runs; eager mode and torch.export run the function itself.
"""

from __future__ import annotations

from typing import Any

import torch


def setitem(target: Any, index: Any, value: Any) -> Any:
    """A new tensor: ``target`` with ``target[index] = value`` applied; ``target`` itself is left as it was.

    Generated code rebinds the name (``x = setitem(x, index, value)``) and registers
    the function with ``torch.fx.wrap``, so symbolic tracing, which cannot record an
    assignment into a Proxy, records one call.  Out of place because a tracer that
    keeps only what the output is computed from (FTPipe's drops every node whose
    result is unused) would drop an in-place assignment: ``target[index] = value``
    returns nothing, and the tensor returned after it is the node from before.  Here
    every step's result is the next step's input: ``slice_scatter`` /
    ``select_scatter`` per indexed dimension, outermost first, around the value
    converted and broadcast as ``copy_`` does.  The elements stored are the same
    bits as the in-place assignment's, and so are the gradients (the assigned
    region's gradient goes to ``value``, the rest to ``target``).

    ``index`` is basic indexing: an int, a slice or ``...``, or a tuple of them;
    ``None``, booleans and tensors (advanced indexing) raise ``TypeError``.  The Python
    decisions read no tensor data and no symbolic bound (an ``...`` counts the
    dimensions after it from the end), so tracers that wrap every value follow the
    calls and torch.export keeps dynamic dimensions dynamic; only the value's shape
    (broadcast or not) is a branch a tracer records as taken.
    """
    elements = index if isinstance(index, tuple) else (index,)
    # isinstance, not ``is`` or truth values, throughout: strict torch.export takes both as constants of the
    # whole slice or list, specializing every symbolic bound in it (the T5 mask's length).
    for element in elements:
        if isinstance(element, (type(None), bool, torch.Tensor)):
            raise TypeError(f"setitem: basic indexing only (ints, slices, ...), got {element!r}")
    ellipses = [position for position, element in enumerate(elements) if isinstance(element, type(Ellipsis))]
    if len(ellipses) > 1:
        raise TypeError("setitem: an index can only have a single ellipsis ('...')")
    split = ellipses[0] if len(ellipses) > 0 else len(elements)
    # (dimension of target, element), outermost first: counted from the front before the ellipsis, from
    # the end after it.
    after = elements[split + 1:]
    steps = [*enumerate(elements[:split]), *((position - len(after), e) for position, e in enumerate(after))]
    kept = [(d, e) for d, e in steps if not _whole(e)]
    # A whole-tensor assignment still scatters (along dimension 0): the result stays a function of target, whose
    # gradient is then zeros, not none, as after the in-place assignment.
    return _scatter(target, kept if len(kept) > 0 else [(0, slice(None))], value)


def _whole(element: Any) -> bool:
    """``:``: the dimension as it is, nothing to scatter."""
    return isinstance(element, slice) and all(isinstance(bound, type(None))
                                              for bound in (element.start, element.stop, element.step))


def _scatter(target: Any, steps: list[tuple[int, Any]], value: Any) -> Any:
    if len(steps) == 0:
        return _filled(target, value)
    (dimension, element), rest = steps[0], steps[1:]
    if isinstance(element, slice):
        part = target[_at(dimension, element)]
        step = 1 if isinstance(element.step, type(None)) else element.step
        return torch.slice_scatter(target, _scatter(part, rest, value), dimension, element.start, element.stop, step)
    part = target.select(dimension, element)
    # The int is gone from ``part``: front-counted dimensions after it move one down.
    rest = [(d - 1 if d > dimension >= 0 else d, e) for d, e in rest]
    return torch.select_scatter(target, _scatter(part, rest, value), dimension, element)


def _at(dimension: int, element: Any) -> tuple[Any, ...]:
    """The index of ``element`` at ``dimension`` (negative: from the end) alone."""
    if dimension >= 0:
        return (*(slice(None),) * dimension, element)
    return (Ellipsis, element, *(slice(None),) * (-dimension - 1))


def _filled(part: Any, value: Any) -> Any:
    """``value`` converted and broadcast to ``part`` as the in-place assignment does, gradient included."""
    if isinstance(value, (bool, int, float, complex)):
        return torch.as_tensor(value, dtype=part.dtype, device=part.device).expand_as(part)
    # The in-place assignment converts a tensor's gradient to its dtype, then sums it over the broadcast
    # dimensions (copy_); a 0-dim tensor fills (fill_): its gradient is summed, then converted.
    if value.dim() == 0:
        value = value.to(dtype=part.dtype, device=part.device)
    if value.shape != part.shape:
        # Both sum over a contiguous copy of the gradient (CopySlices); ``* 1`` (exact) makes the gradient that
        # reaches expand's sum contiguous too, so the sum runs in the same order.
        value = value.expand_as(part) * 1
    return value.to(dtype=part.dtype, device=part.device)
