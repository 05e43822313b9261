"""Runtime layers and helpers imported by generated model code (depends on torch only)."""

from stateless.checks import is_None, is_not_None
from stateless.dropout import FunctionalDropout
from stateless.dtypes import finfo, finfo_value, module_dtype
from stateless.fp16 import clamp_inf_fp16
from stateless.layerdrop import LayerDrop, unless_dropped
from stateless.layers import StatelessEmbedding, StatelessLinear
from stateless.leaves import setitem
from stateless.losses import classification_loss, problem_type_of
from stateless.masks import create_bidirectional_mask, create_causal_mask
from stateless.sharing import (
    call_shared,
    is_stateless,
    make_stateful,
    make_stateless,
    shared_weight,
    stateful_state_dict,
)

__all__ = [
    "FunctionalDropout",
    "LayerDrop",
    "StatelessEmbedding",
    "StatelessLinear",
    "call_shared",
    "classification_loss",
    "clamp_inf_fp16",
    "create_bidirectional_mask",
    "create_causal_mask",
    "finfo",
    "finfo_value",
    "is_None",
    "is_not_None",
    "is_stateless",
    "make_stateful",
    "make_stateless",
    "module_dtype",
    "problem_type_of",
    "setitem",
    "shared_weight",
    "stateful_state_dict",
    "unless_dropped",
]
