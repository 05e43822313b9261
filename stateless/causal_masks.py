"""The decoder-only LLMs' causal and sliding-window masks (transformers 4.5x and 5.x), for eager attention without a cache.

The converter redirects ``transformers.masking_utils.create_causal_mask`` and
``create_sliding_window_causal_mask`` here (Llama, Qwen2, Qwen3, Mistral, Gemma 3), one pair per
era because the parameters differ: 5.x takes ``inputs_embeds`` (:func:`create_causal_mask`,
:func:`create_sliding_window_causal_mask`), 4.5x ``input_embeds`` and ``cache_position``
(:func:`create_causal_mask_v4`, :func:`create_sliding_window_causal_mask_v4`).  What comes back is
what HF computes with ``config._attn_implementation == "eager"`` and no cache: a float mask
``(batch, 1, q_len, kv_len)``, 0 where a query attends a key and ``finfo(dtype).min`` where not.

Unlike :mod:`stateless.masks` (encoder-decoders, which refuses them), these take ``position_ids``
without an ``attention_mask``, as every LLM forward passes them: HF then reads their values to find
packed sequences (``find_packed_sequence_indices``: a new sequence starts where a position is not
the previous one plus 1) and lets a query see only keys of its own sequence.  That branch on data
is written here without a branch: the same-sequence test is always applied.  When nothing is
packed every row's positions are ``p0 + i``, so each query is in sequence 0 with every key and the
position-based causal and window tests of 5.x equal the index-based ones: the mask is HF's in both
cases, and traceable (torch.fx, torch.export strict and non-strict, dynamic dims).

4.5x: the query indices are ``cache_position`` (HF's ``sdpa_mask`` vmaps over them); kv_len is
the sequence length and a padding mask of another length is cut or padded with "padded", as
``prepare_padding_mask`` does.  5.x: queries are ``0..q_len-1``, kv_len the padding mask's length.

Config read: ``sliding_window`` (window masks), ``is_causal`` (5.x, False: the bidirectional mask of
:mod:`stateless.masks`; windowed: refused).  Refused with a ``ValueError`` naming the argument, as
in :mod:`stateless.masks`: a cache, mask functions, ``block_sequence_ids``, ``layer_idx``, a
padding mask that is not 2D.  ``past_key_values`` defaults to None (HF's has no default): a converted
model without a cache may call these with the argument folded away (Mistral picks its mask function
into a local, whose call the specialization cannot resolve).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from stateless.checks import is_None, is_not_None
from stateless.dtypes import finfo
from stateless.masks import _check_padding_mask, _refuse_cache_arguments, create_bidirectional_mask

torch.fx.wrap("finfo")


def create_causal_mask(config: Any, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                       past_key_values: Any = None, position_ids: torch.Tensor | None = None, or_mask_function: Any = None,
                       and_mask_function: Any = None, block_sequence_ids: Any = None, layer_idx: Any = None,
                       allow_is_causal_skip: bool = True) -> torch.Tensor:
    """HF 5.x's eager causal mask without a cache (same parameters)."""
    _refuse("create_causal_mask", past_key_values, or_mask_function, and_mask_function, block_sequence_ids,
            layer_idx, attention_mask)
    if not getattr(config, "is_causal", True):
        return create_bidirectional_mask(config, inputs_embeds, attention_mask,
                                         allow_is_bidirectional_skip=allow_is_causal_skip)
    return _mask(inputs_embeds, attention_mask, position_ids, None, None, packed_by_position=True)


def create_sliding_window_causal_mask(config: Any, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                                      past_key_values: Any = None, position_ids: torch.Tensor | None = None,
                                      or_mask_function: Any = None, and_mask_function: Any = None,
                                      block_sequence_ids: Any = None, layer_idx: Any = None,
                                      allow_is_causal_skip: bool = True) -> torch.Tensor:
    """HF 5.x's eager sliding-window causal mask without a cache: also ``kv > q - config.sliding_window``."""
    _refuse("create_sliding_window_causal_mask", past_key_values, or_mask_function, and_mask_function,
            block_sequence_ids, layer_idx, attention_mask)
    if not getattr(config, "is_causal", True):
        raise ValueError("create_sliding_window_causal_mask: config.is_causal False (a bidirectional window) is "
                         "not supported")
    return _mask(inputs_embeds, attention_mask, position_ids, None, _window(config, "create_sliding_window_causal_mask"),
                 packed_by_position=True)


def create_causal_mask_v4(config: Any, input_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                          cache_position: torch.Tensor, past_key_values: Any = None,
                          position_ids: torch.Tensor | None = None,
                          or_mask_function: Any = None, and_mask_function: Any = None) -> torch.Tensor:
    """HF 4.5x's eager causal mask without a cache (same parameters)."""
    _refuse("create_causal_mask", past_key_values, or_mask_function, and_mask_function, None, None, attention_mask)
    return _mask(input_embeds, attention_mask, position_ids, cache_position, None, packed_by_position=False)


def create_sliding_window_causal_mask_v4(config: Any, input_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                                         cache_position: torch.Tensor, past_key_values: Any = None,
                                         position_ids: torch.Tensor | None = None, or_mask_function: Any = None,
                                         and_mask_function: Any = None) -> torch.Tensor:
    """HF 4.5x's eager sliding-window causal mask without a cache."""
    _refuse("create_sliding_window_causal_mask", past_key_values, or_mask_function, and_mask_function, None, None,
            attention_mask)
    return _mask(input_embeds, attention_mask, position_ids, cache_position,
                 _window(config, "create_sliding_window_causal_mask"), packed_by_position=False)


def prepare_4d_causal_attention_mask(attention_mask: torch.Tensor | None, input_shape: Any, inputs_embeds: torch.Tensor,
                                     past_key_values_length: int, sliding_window: int | None = None) -> torch.Tensor:
    """HF 4.40's ``modeling_attn_mask_utils._prepare_4d_causal_attention_mask`` (eager Qwen2, Mistral) without a cache.

    Its window lets a query see ``sliding_window + 1`` keys (``_make_causal_mask``: ``tril(diagonal=-window-1)``
    masked), one more than the mask functions' ``kv > q - window``; a key is padding unless its mask value is
    exactly 1 (``_expand_mask`` masks ``1 - mask != 0``).  ``input_shape`` is the embeddings' (batch, q_len).
    """
    function = "_prepare_4d_causal_attention_mask"
    if past_key_values_length != 0:
        raise ValueError(f"{function}: past_key_values_length {past_key_values_length} is not supported "
                         "(stateless.causal_masks builds the eager mask of a pipeline without a cache)")
    _check_padding_mask(function, attention_mask)
    window = None if sliding_window is None else sliding_window + 1
    padding = attention_mask == 1 if is_not_None(attention_mask) else None
    return _mask(inputs_embeds, padding, None, None, window, packed_by_position=False)



def prepare_4d_attention_mask(mask: torch.Tensor, dtype: Any, tgt_len: Any = None) -> torch.Tensor:
    """HF 4.35's ``modeling_attn_mask_utils._prepare_4d_attention_mask`` (BART's encoder and cross-attention masks).

    The same arithmetic as its ``AttentionMaskConverter._expand_mask``: (batch, 1, tgt_len, src_len), 0 where the
    mask is 1 and ``finfo(dtype).min`` elsewhere; sizes read by index and the minimum through the fx leaf
    ``finfo``, so a traced dtype and traced lengths work.
    """
    batch, source = mask.size(0), mask.size(1)
    target = source if is_None(tgt_len) else tgt_len
    expanded = mask[:, None, None, :].expand(batch, 1, target, source).to(dtype)
    inverted = 1.0 - expanded
    return inverted.masked_fill(inverted.to(torch.bool), finfo(dtype).min)

def _refuse(function: str, past_key_values: Any, or_mask_function: Any, and_mask_function: Any,
            block_sequence_ids: Any, layer_idx: Any, attention_mask: Any) -> None:
    _refuse_cache_arguments(function, past_key_values=past_key_values, or_mask_function=or_mask_function,
                            and_mask_function=and_mask_function, block_sequence_ids=block_sequence_ids,
                            layer_idx=layer_idx)
    _check_padding_mask(function, attention_mask)


def _window(config: Any, function: str) -> int:
    window = getattr(config, "sliding_window", None)
    if window is None:
        raise ValueError(f"{function}: config.sliding_window is not set")
    return window


def _mask(embeds: torch.Tensor, attention_mask: Any, position_ids: Any, cache_position: Any, window: int | None,
          packed_by_position: bool) -> torch.Tensor:
    """HF's non-vmap ``sdpa_mask`` then ``eager_mask``'s bool -> (0, min), with the packed-sequence test always on.

    ``cache_position`` None: 5.x (queries ``0..q_len-1``, kv_len the padding mask's or q_len); else 4.5x
    (queries ``cache_position``, kv_len q_len, the padding mask cut or padded to it).
    ``packed_by_position``: 5.x compares positions, not indices, in the causal and window tests of a packed batch.
    """
    device = embeds.device
    batch_size, q_length, dtype = embeds.shape[0], embeds.shape[1], embeds.dtype
    padding = None
    if is_None(cache_position):
        q_idx = torch.arange(q_length, device=device)
        kv_length = attention_mask.shape[-1] if is_not_None(attention_mask) else q_length
        if is_not_None(attention_mask):
            padding = attention_mask.to(device=device, dtype=torch.bool)
    else:
        q_idx = cache_position
        kv_length = q_length
        if is_not_None(attention_mask):
            # prepare_padding_mask pads a short mask with "padded"; padding_mask_function reads only kv_len columns.
            padding = F.pad(attention_mask.to(device=device, dtype=torch.bool), (0, kv_length - attention_mask.shape[-1]))
    kv_idx = torch.arange(kv_length, device=device)
    batch_idx = torch.arange(batch_size, device=device)[:, None, None, None]
    q, kv = q_idx[None, None, :, None], kv_idx[None, None, None, :]
    packed = is_not_None(position_ids) and is_None(attention_mask)
    if packed:
        positions = position_ids.expand(batch_size, -1)
        first = positions[:, :1] - 1
        sequence = (torch.diff(positions, prepend=first, dim=-1) != 1).cumsum(-1)
        same_sequence = sequence[batch_idx, q] == sequence[batch_idx, kv]
        if packed_by_position:  # 5.x remaps the mask function's indices to positions
            q, kv = positions[batch_idx, q], positions[batch_idx, kv]
    allowed = kv <= q
    if window is not None:
        allowed = allowed & (kv > q - window)
    if packed:
        allowed = allowed & same_sequence
    if padding is not None:
        allowed = allowed & padding[batch_idx, kv_idx[None, None, None, :]]
    allowed = allowed.expand(batch_size, -1, q_length, kv_length)
    return torch.where(allowed, torch.zeros((), device=device, dtype=dtype), finfo(dtype).min)
