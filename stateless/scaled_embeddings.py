"""The shared-weight runtime (:mod:`stateless.sharing`) for an embedding that scales what it looks up.

Gemma 3's ``Gemma3TextScaledWordEmbedding`` is an ``nn.Embedding`` whose forward is
``super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)``, ``embed_scale`` a 0-dim,
non-persistent buffer (``sqrt(hidden_size)``).  :func:`stateless.sharing.make_stateless` replaces every
user of the shared weight by a plain :class:`~stateless.layers.StatelessEmbedding`, which would drop the
scale.  A recipe names this module as the ``shared_weight`` transform's ``runtime``; its
:func:`make_stateless` does the same and then gives each user a :class:`StatelessScaledEmbedding`, which
carries the buffer itself (moved with the model by ``.to()``) and multiplies exactly as the stock forward
does, the weight passed in.  :func:`make_stateful` gives back the original modules, with the buffers the
stateless layers hold now.  Everything else is :mod:`stateless.sharing`'s.

BART's ``BartScaledWordEmbedding`` (4.46 on) scales by a plain number instead:
``super().forward(input_ids) * self.embed_scale``, ``embed_scale`` a float attribute (1.0 unless
``scale_embedding``); the stateless layer multiplies by the same number.

A holder with neither a 0-dim ``embed_scale`` buffer nor a number ``embed_scale`` is refused (``TypeError``):
the stateless form would not compute what the stateful one does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from stateless.layers import StatelessEmbedding
from stateless.sharing import _set_submodule, _spec, call_shared, make_stateful, shared_weight, stateful_state_dict
from stateless.sharing import make_stateless as _make_stateless
from stateless.torch_internals import non_persistent_buffers, own_buffers

__all__ = ["StatelessScaledEmbedding", "call_shared", "make_stateful", "make_stateless", "shared_weight",
           "stateful_state_dict"]

SCALE = "embed_scale"  # the buffer Gemma's scaled embeddings multiply by


class StatelessScaledEmbedding(StatelessEmbedding):
    """A scaled embedding without its weight: ``forward(weight, input_ids)``, times the ``embed_scale`` buffer."""

    def __init__(self, embedding: nn.Embedding) -> None:
        scale = own_buffers(embedding).get(SCALE)
        number = embedding.__dict__.get(SCALE)  # BART's: a plain attribute
        buffer = isinstance(scale, torch.Tensor) and scale.dim() == 0
        if not buffer and not (isinstance(number, (int, float)) and not isinstance(number, bool)):
            raise TypeError(f"make_stateless: a {type(embedding).__name__} has neither a 0-dim {SCALE} buffer nor a "
                            f"number {SCALE} to scale by")
        super().__init__(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx, embedding.max_norm,
                         embedding.norm_type, embedding.scale_grad_by_freq, embedding.sparse)
        if buffer:
            self.register_buffer(SCALE, scale, persistent=SCALE not in non_persistent_buffers(embedding))
        else:
            self.embed_scale = number
        self.__dict__["_stateful"] = embedding  # not a submodule: its weight is the shared parameter

    def forward(self, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        # The stock forward's operations, in its order: the lookup, then times the scale (a buffer cast to the
        # weight's dtype, or the number as it is).
        looked_up = F.embedding(input_ids, weight, self.padding_idx, self.max_norm, self.norm_type,
                                self.scale_grad_by_freq, self.sparse)
        scale: torch.Tensor | float = self.embed_scale  # type: ignore[assignment]  # a buffer or a number, never None
        return looked_up * (scale.to(weight.dtype) if isinstance(scale, torch.Tensor) else scale)

    def to_embedding(self, weight: nn.Parameter) -> nn.Embedding:
        """The original module again, owning ``weight`` and this layer's (possibly moved) scale."""
        embedding: nn.Embedding = self.__dict__["_stateful"]
        embedding.weight = weight
        if SCALE in own_buffers(self):
            own_buffers(embedding)[SCALE] = own_buffers(self)[SCALE]
        return embedding


def make_stateless(model: nn.Module, *, shared: str, weight: str, users: Sequence[str],
                   tied_linear: str | None = None) -> nn.Module:
    """:func:`stateless.sharing.make_stateless`, each user keeping its scale; a no-op when already stateless."""
    if _spec(model) is not None:
        return model
    layers = {}
    for name in users:  # every refusal before the model changes
        original = model.get_submodule(name)
        if not isinstance(original, nn.Embedding):
            raise TypeError(f"make_stateless: {name} is a {type(original).__name__}, not an nn.Embedding")
        layers[name] = StatelessScaledEmbedding(original)
    _make_stateless(model, shared=shared, weight=weight, users=users, tied_linear=tied_linear)
    for name, layer in layers.items():
        _set_submodule(model, name, layer)
    return model
