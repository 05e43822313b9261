"""None checks as named calls, the form converted models use instead of ``is``.

An identity comparison is invisible to a tracer: Python evaluates it on
whatever object the tracer passed, so a Proxy or a wrapper is never ``None``
and the check silently turns into a constant.  A call to one of these functions
is an ordinary call a tracer can recognise by name (FTPipe's tracer does) and
evaluate on the real value.  They stay plain functions, not ``torch.fx.wrap``
targets: under ``symbolic_trace`` with ``concrete_args`` a check on a concrete
``None`` runs in Python and records nothing in the graph.
"""

from __future__ import annotations

from typing import Any


def is_None(value: Any) -> bool:
    """``value is None``."""
    return value is None


def is_not_None(value: Any) -> bool:
    """``value is not None``."""
    return value is not None
