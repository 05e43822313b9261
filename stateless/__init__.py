"""Runtime layers and helpers imported by generated model code (depends on torch only)."""

from stateless.checks import is_None, is_not_None
from stateless.fp16 import cast_to_half_weight, clamp_inf_fp16

__all__ = ["cast_to_half_weight", "clamp_inf_fp16", "is_None", "is_not_None"]
