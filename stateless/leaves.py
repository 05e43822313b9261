"""Operations symbolic tracing cannot record, as functions generated modules register with ``torch.fx.wrap``.

Where an argument is a Proxy, fx records one call of the function, made when the
graph runs; eager mode and torch.export run the function itself.
"""

from __future__ import annotations

from typing import Any


def setitem(target: Any, index: Any, value: Any) -> Any:
    """``target[index] = value``, then ``target``; generated modules register it with ``torch.fx.wrap``.

    Symbolic tracing cannot record an assignment into a Proxy; as a leaf, the
    same in-place assignment is recorded and made when the graph runs.
    """
    target[index] = value
    return target
