"""Traceable forms of HuggingFace's float16 guards.

Generated code calls these instead of branching on tensor data; its module
registers them with ``torch.fx.wrap`` so symbolic tracing records each call as
one leaf node, while torch.export traces through the body.  (Branches on dtypes
alone become leaf functions of the generated module itself: ``dtype_branch_leaf``.)
"""

from __future__ import annotations

import torch

# HF keeps this margin below the float16 maximum so that the clamped values
# survive the residual additions that follow without overflowing again.
_FP16_CLAMP = torch.finfo(torch.float16).max - 1000


def clamp_inf_fp16(hidden_states: torch.Tensor, nan: bool = False) -> torch.Tensor:
    """Clamp a float16 tensor to +-(float16 max - 1000) when any of its elements is infinite (or, with
    ``nan``, NaN).

    Same values and gradients as HF's
    ``if x.dtype == torch.float16 and torch.isinf(x).any(): x = torch.clamp(x, min=-c, max=c)``
    (``... and (torch.isinf(x).any() or torch.isnan(x).any())`` with ``nan``),
    but the data-dependent branch is a ``torch.where`` on a 0-d condition, so
    torch.export needs no guard on tensor data.  Other dtypes are returned as they are.
    """
    # The dtype is static under every tracer, so this branch is safe to take in Python.
    if hidden_states.dtype != torch.float16:
        return hidden_states
    clamped = torch.clamp(hidden_states, min=-_FP16_CLAMP, max=_FP16_CLAMP)
    condition = torch.isinf(hidden_states).any()
    if nan:
        condition = condition | torch.isnan(hidden_states).any()
    return torch.where(condition, clamped, hidden_states)
