"""None checks as named calls, the form converted models use instead of ``is``.

An identity comparison is invisible to a tracer: Python evaluates it on
whatever object the tracer passed, so a Proxy or a wrapper is never ``None``
and the check silently turns into a constant.  These helpers compare through
``operator.is_`` / ``operator.is_not``, looked up on the ``operator`` module at
every call.  That is the hook FTPipe's tracer offers: its T5 task registers
``operator.is_`` and ``operator.is_not`` as explicitly untraced functions,
which rebinds them on the module to wrappers that unwrap traced values
(``None`` included) before comparing.  It does not recognise these helpers by
name; a ``from operator import is_`` binding would bypass the rebinding.

They stay plain functions, not ``torch.fx.wrap`` targets: under
``symbolic_trace`` with ``concrete_args`` a check on a concrete ``None`` runs
in Python and records nothing in the graph.
"""

from __future__ import annotations

import operator
from typing import Any


def is_None(value: Any) -> bool:
    """``value is None``, evaluated on the unwrapped value under FTPipe's tracer."""
    return operator.is_(value, None)


def is_not_None(value: Any) -> bool:
    """``value is not None``, evaluated on the unwrapped value under FTPipe's tracer."""
    return operator.is_not(value, None)
