"""``torch.finfo`` of a dtype read off a traced tensor, in a form every tracer accepts.

Generated code calls :func:`finfo_value` where HF wrote ``torch.finfo(x.dtype).min``
(BART's attention masks); its module registers it with ``torch.fx.wrap``, so
``symbolic_trace``, which sees ``x.dtype`` as a Proxy that ``torch.finfo`` refuses,
records one leaf call evaluated at run time.  torch.export has real dtypes.  A
tracer that wraps the dtype in a value object of its own (FTPipe's) gets the
answer from comparisons with each floating dtype, which such a tracer evaluates
(and bakes, as the dtype is fixed for a traced model).
"""

from __future__ import annotations

from typing import Any

import torch

_FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def finfo_value(dtype: Any, name: str) -> Any:
    """``getattr(torch.finfo(dtype), name)``: the same number, for a dtype or a tracer's stand-in for one."""
    if not isinstance(dtype, torch.dtype):
        dtype = next((candidate for candidate in _FLOATING if dtype == candidate), dtype)
    return getattr(torch.finfo(dtype), name)
