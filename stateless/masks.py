"""transformers 5.x's ``create_causal_mask`` / ``create_bidirectional_mask``, for eager attention without a cache.

The converter redirects calls of ``transformers.masking_utils.create_causal_mask`` and
``create_bidirectional_mask`` here; the generated code passes exactly the arguments HF's functions
take (same names, order and defaults).  What comes back is what HF 5.23.0 computes when
``config._attn_implementation == "eager"`` and there is no cache: a float mask of shape
``(batch, 1, q_len, kv_len)``, 0 where a query attends a key and ``torch.finfo(dtype).min`` where
not.  Two differences, both on purpose:

* HF returns ``None`` for a bidirectional mask with nothing padded (decided by reading the mask's
  values).  Here the all-zero mask comes back instead: eager attention adds the mask to the scores,
  ``x + 0.0 == x``, and a traced graph needs a tensor whatever the data.
* HF's functions are not traceable (``padding_mask.all()``, walruses on shapes, ``isinstance`` on
  caches); these are, with torch.fx (``finfo`` is an fx leaf, registered below in this module's
  globals, where fx patches it), torch.export (strict and non-strict, dynamic dims) and eagerly.

Before (generated from HF 5.23.0's T5Stack)::

    attention_mask = create_causal_mask(config=self.config, inputs_embeds=inputs_embeds,
                                        attention_mask=attention_mask, past_key_values=None)

after the redirect, the same call reaches :func:`create_causal_mask` below.

Config attributes read: ``is_causal`` only, as ``getattr(config, "is_causal", True)``, which HF
reads the same way (False turns ``create_causal_mask`` into the bidirectional mask).  Not read:
``_attn_implementation``.  These functions are the eager form by contract: the generated model's
attention is specialized to eager, and a config that says "sdpa" (HF's default once a model is
built) or ``None`` (a bare config, for which HF returns no mask at all) must not change the mask
the eager attention adds.

Refused, each with a ``ValueError`` naming the argument (with them HF builds a cache's, a packed
batch's or a custom pattern's mask, which this module does not): ``past_key_values``,
``or_mask_function``, ``and_mask_function``, ``block_sequence_ids`` and ``layer_idx`` when not None
(the last two also under ``is_causal=False``, where HF drops them silently: a caller passing them
expects an effect); ``position_ids`` with no ``attention_mask`` in the causal case (HF then detects
packed sequences from their values; with a mask, or for a bidirectional mask, HF does not read them,
and neither does this); an ``attention_mask`` that is not 2D (HF returns a 4D one unchanged) or is a
flex-attention ``BlockMask``.  Under ``symbolic_trace`` a traced argument is a Proxy whose rank is
unknown: only what is concrete is checked there (a Proxy is never None, so a traced
``past_key_values`` is refused).  ``allow_is_causal_skip`` / ``allow_is_bidirectional_skip``
only choose between ``None`` and the zero mask in HF, and have no effect here;
``create_bidirectional_mask``'s ``**kwargs`` are ignored, as HF ignores them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx
from torch.nn.attention.flex_attention import BlockMask

from stateless.checks import is_None, is_not_None
from stateless.dtypes import finfo

torch.fx.wrap("finfo")


def create_causal_mask(
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    past_key_values: Any,
    position_ids: torch.Tensor | None = None,
    or_mask_function: Callable[..., Any] | None = None,
    and_mask_function: Callable[..., Any] | None = None,
    block_sequence_ids: torch.Tensor | None = None,
    layer_idx: int | None = None,
    allow_is_causal_skip: bool = True,
) -> torch.Tensor:
    """HF 5.23.0's eager causal mask without a cache: key ``k`` is visible to query ``q`` iff ``k <= q`` and unpadded.

    ``inputs_embeds`` (batch, q_len, ...) gives batch, q_len, dtype and device; ``attention_mask``
    (batch, kv_len) of any dtype, cast to bool, marks the keys that are not padding; kv_len is its
    last dimension, or q_len without it.  With ``config.is_causal`` False this is
    :func:`create_bidirectional_mask`, as in HF.
    """
    _refuse_cache_arguments("create_causal_mask", past_key_values=past_key_values,
                            or_mask_function=or_mask_function, and_mask_function=and_mask_function,
                            block_sequence_ids=block_sequence_ids, layer_idx=layer_idx)
    _check_padding_mask("create_causal_mask", attention_mask)
    if not getattr(config, "is_causal", True):
        return create_bidirectional_mask(config, inputs_embeds, attention_mask,
                                         allow_is_bidirectional_skip=allow_is_causal_skip)
    if is_not_None(position_ids) and is_None(attention_mask):
        raise ValueError("create_causal_mask: position_ids without an attention_mask is not supported: HF then reads "
                         "their values to detect packed sequences; pass position_ids=None or a 2D attention_mask")
    return _eager_mask(inputs_embeds, attention_mask, None, causal=True)


def create_bidirectional_mask(
    config: Any,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    encoder_hidden_states: torch.Tensor | None = None,
    past_key_values: Any = None,
    or_mask_function: Callable[..., Any] | None = None,
    and_mask_function: Callable[..., Any] | None = None,
    allow_is_bidirectional_skip: bool = True,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """HF 5.23.0's eager bidirectional mask without a cache: every unpadded key is visible; zeros where HF returns None.

    Self-attention: batch and dtype from ``inputs_embeds``, kv_len = q_len.  Cross-attention
    (``encoder_hidden_states`` given): batch, dtype and kv_len from ``encoder_hidden_states``, q_len
    from ``inputs_embeds``.  ``attention_mask`` (batch, kv_len), cast to bool, marks the keys that
    are not padding and, when given, sets kv_len.  The device is ``inputs_embeds``'s, as in HF.
    """
    _refuse_cache_arguments("create_bidirectional_mask", past_key_values=past_key_values,
                            or_mask_function=or_mask_function, and_mask_function=and_mask_function)
    _check_padding_mask("create_bidirectional_mask", attention_mask)
    mask = _eager_mask(inputs_embeds, attention_mask, encoder_hidden_states, causal=False)
    if is_not_None(position_ids) and is_None(attention_mask) and is_None(encoder_hidden_states):
        # 5.25 passes the positions, and HF then reads them for packed sequences (a new one wherever a position is
        # not the previous one + 1): a token sees the keys of its own sequence only. HF skips this where every row
        # is one sequence, and then every pair is of one sequence: the same mask either way, with no branch on values.
        positions = cast(torch.Tensor, position_ids)  # is_not_None narrows nothing for mypy
        first = positions[:, :1] - 1
        packed = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
        same = packed[:, None, :, None] == packed[:, None, None, :]
        mask = mask.masked_fill(~same, finfo(mask.dtype).min)
    return mask


def _eager_mask(inputs_embeds: torch.Tensor, attention_mask: Any, encoder_hidden_states: Any,
                causal: bool) -> torch.Tensor:
    """HF's ``sdpa_mask`` (non-vmap) followed by ``eager_mask``'s bool -> (0, min) conversion, without offsets.

    ``attention_mask`` and ``encoder_hidden_states`` are tensors or None, told apart with
    ``is_None`` (which a tracer that wraps None can unwrap; mypy cannot narrow through it).
    """
    embeds = inputs_embeds if is_None(encoder_hidden_states) else encoder_hidden_states
    device = inputs_embeds.device
    batch_size, dtype = embeds.shape[0], embeds.dtype
    q_length = inputs_embeds.shape[1]
    if is_not_None(attention_mask):
        kv_length = attention_mask.shape[-1]
    else:
        kv_length = q_length if is_None(encoder_hidden_states) else encoder_hidden_states.shape[1]
    q_idx = torch.arange(q_length, device=device)[None, None, :, None]
    kv_idx = torch.arange(kv_length, device=device)[None, None, None, :]
    # HF's causal_mask_function and bidirectional_mask_function, broadcast over (batch, head, q, kv).
    allowed = kv_idx <= q_idx if causal else q_idx >= 0
    if is_not_None(attention_mask):
        padding_mask = attention_mask.to(device=device, dtype=torch.bool)
        # Indexed as HF's padding_mask_function does (not broadcast), so a mask whose batch
        # differs from the embeddings' fails or is cut exactly where HF's does.
        batch_idx = torch.arange(batch_size, device=device)[:, None, None, None]
        allowed = allowed & padding_mask[batch_idx, kv_idx]
    allowed = allowed.expand(batch_size, -1, q_length, kv_length)
    return torch.where(allowed, torch.zeros((), device=device, dtype=dtype), finfo(dtype).min)


def _refuse_cache_arguments(function: str, **arguments: Any) -> None:
    for name, value in arguments.items():
        if is_not_None(value):
            raise ValueError(f"{function}: {name} is not supported (stateless.masks builds the eager mask of a "
                             f"pipeline without a cache); pass {name}=None")


def _check_padding_mask(function: str, attention_mask: Any) -> None:
    """Only a 2D padding mask; the rank of a traced Proxy is unknown and not checked."""
    if isinstance(attention_mask, BlockMask):
        raise ValueError(f"{function}: attention_mask is a flex-attention BlockMask; only a 2D (batch, kv_len) "
                         "padding mask is supported")
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() != 2:
        raise ValueError(f"{function}: attention_mask has {attention_mask.dim()} dimensions; only a 2D "
                         "(batch, kv_len) padding mask is supported (HF returns a prepared 4D mask unchanged)")
