"""``torch.autocast`` only where it changes something, as transformers 5.x's ``maybe_autocast`` does.

The 4.5x LLMs' rotary embeddings compute cos/sin under ``with torch.autocast(device_type, enabled=False)``
(float32 even inside a caller's autocast region).  Where autocast is off already, that region changes
nothing, yet torch.export records it as a higher-order op (``wrap_with_autocast``): a submodule whose
tuple output torch.distributed.pipelining's stage splitting cannot send or take as an argument
(``Expected positional argument for parameter submod_1``, ``'tuple' object has no attribute 'shape'``).
The converter redirects ``torch.autocast`` here (``leaf_calls``, traced): the same context where autocast
is on or asked for, no context otherwise.  Eager results are the same either way.  On ``meta`` (a model traced
there before its stages are loaded) there is no autocast to ask about: no context, as 5.x's does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def maybe_autocast(device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                   cache_enabled: bool | None = None) -> Any:
    """``torch.autocast(...)`` if autocast is enabled for ``device_type`` or ``enabled``; else a null context."""
    if device_type == "meta":  # torch.is_autocast_enabled("meta") raises
        return contextlib.nullcontext()
    if torch.is_autocast_enabled(device_type) or enabled:
        return torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    return contextlib.nullcontext()
