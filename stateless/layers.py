"""Layers whose weight is a forward argument instead of a parameter they own.

A pipeline partitioner sees a weight used in several places as one graph
input feeding every consumer only if no module owns it: the model keeps the
single ``nn.Parameter`` at top level and passes it to each stateless layer.
Both layers compute exactly what the module they replace computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class StatelessEmbedding(nn.Module):
    """``nn.Embedding`` without its weight: ``forward(weight, input_ids)``."""

    # Read by stateless.call_shared through attribute lookup, which tracers that
    # wrap submodules (FTPipe's) forward to the wrapped module; isinstance would not see it.
    takes_shared_weight = True

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse

    @classmethod
    def like(cls, embedding: nn.Embedding) -> StatelessEmbedding:
        """A stateless layer with every setting of ``embedding`` (its weight excluded)."""
        return cls(embedding.num_embeddings, embedding.embedding_dim, embedding.padding_idx, embedding.max_norm,
                   embedding.norm_type, embedding.scale_grad_by_freq, embedding.sparse)

    def forward(self, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        # The same call nn.Embedding.forward makes, so results are bit-identical.
        return F.embedding(input_ids, weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def to_embedding(self, weight: nn.Parameter) -> nn.Embedding:
        """The stateful layer again, owning ``weight``."""
        embedding = nn.Embedding(self.num_embeddings, self.embedding_dim, self.padding_idx, self.max_norm,
                                 self.norm_type, self.scale_grad_by_freq, self.sparse, device="meta")
        embedding.weight = weight
        return embedding

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}"


class StatelessLinear(nn.Module):
    """``nn.Linear`` without its weight: ``forward(weight, x)``; it keeps its bias, if any."""

    takes_shared_weight = True  # see StatelessEmbedding

    def __init__(self, in_features: int, out_features: int, bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.bias = bias

    @classmethod
    def like(cls, linear: nn.Linear) -> StatelessLinear:
        """A stateless layer with the settings and the bias of ``linear``."""
        return cls(linear.in_features, linear.out_features, linear.bias)

    def forward(self, weight: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, weight, self.bias)

    def to_linear(self, weight: nn.Parameter) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight = weight
        if self.bias is not None:
            linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
