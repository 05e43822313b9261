"""Dtypes read off a traced model, in a form every tracer accepts.

Generated code calls :func:`finfo` / :func:`finfo_value` where HF wrote
``torch.finfo(x.dtype)`` (BART's and later T5's attention masks); the generated
modules register them with ``torch.fx.wrap``, so ``symbolic_trace``, which sees
``x.dtype`` as a Proxy that ``torch.finfo`` refuses, records one leaf call
evaluated at run time.  torch.export has real dtypes.  A tracer that wraps the
dtype in a value object of its own (FTPipe's) gets the answer from comparisons
with each floating dtype, which such a tracer evaluates (and bakes, as the dtype
is fixed for a traced model).

:func:`module_dtype` is ``module.dtype`` where a tracer has replaced the
module's own parameters by wrappers (FTPipe's, while the module's forward
runs): ``ModuleUtilsMixin.dtype`` walks ``parameters()``, which hashes each
parameter, and such a wrapper cannot be hashed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stateless.torch_internals import own_parameters

_FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def finfo(dtype: Any) -> torch.finfo:
    """``torch.finfo(dtype)``, for a dtype or a tracer's stand-in for one."""
    if not isinstance(dtype, torch.dtype):
        dtype = next((candidate for candidate in _FLOATING if dtype == candidate), dtype)
    return torch.finfo(dtype)


def finfo_value(dtype: Any, name: str) -> Any:
    """``getattr(torch.finfo(dtype), name)``: the same number, for a dtype or a tracer's stand-in for one."""
    return getattr(finfo(dtype), name)


def module_dtype(module: nn.Module) -> Any:
    """``module.dtype``; the dtype of its first own parameter where a tracer has wrapped its own parameters.

    Eager, fx and torch.export see real tensors and read the release's own
    ``dtype`` property, so results are unchanged.  Only the module whose
    forward runs has wrapped parameters (its submodules are not running), and
    its own parameters come first in ``parameters()``: the first one is the
    parameter ``dtype`` reads (a model's shared weight, which is floating).
    """
    own = [value for value in own_parameters(module).values() if value is not None]
    if all(isinstance(value, torch.Tensor) for value in own):
        return module.dtype
    return own[0].dtype
