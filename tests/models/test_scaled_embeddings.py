"""stateless.scaled_embeddings: the stateless form of a model whose shared embedding scales what it looks up.

A toy model written as the shared_weight transform writes Gemma 3's (an ``nn.Embedding`` subclass multiplying
by a non-persistent ``embed_scale`` buffer, a tied head), no transformers needed.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch import nn

from stateless import scaled_embeddings as runtime
from stateless.layers import StatelessEmbedding
from stateless.scaled_embeddings import StatelessScaledEmbedding


class ScaledEmbedding(nn.Embedding):  # Gemma3TextScaledWordEmbedding's computation
    def __init__(self, num: int, dim: int, padding_idx: int, embed_scale: float) -> None:
        super().__init__(num, dim, padding_idx)
        self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        scale = cast(torch.Tensor, self.embed_scale)  # a buffer
        return super().forward(input_ids) * scale.to(self.weight.dtype)


class Toy(nn.Module):
    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embedding
        self.lm_head = nn.Linear(embedding.embedding_dim, embedding.num_embeddings, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        weight = runtime.shared_weight(self, "embed_tokens", "shared_embed_weight")
        hidden = runtime.call_shared(self.embed_tokens, weight, input_ids)
        return runtime.call_shared(self.lm_head, weight, torch.tanh(hidden))

    def make_stateless(self) -> nn.Module:
        return runtime.make_stateless(self, shared="embed_tokens", weight="shared_embed_weight",
                                      users=("embed_tokens",), tied_linear="lm_head")


def toy(dim: int = 8, dtype: torch.dtype = torch.float32) -> Toy:
    torch.manual_seed(0)
    return Toy(ScaledEmbedding(11, dim, 0, dim**0.5)).to(dtype)


IDS = torch.tensor([[1, 4, 0, 10], [3, 3, 7, 2]])


def test_the_stateless_form_scales_as_the_embedding_does() -> None:
    model = toy()
    expected = model(IDS)
    expected.sum().backward()
    grad = model.embed_tokens.weight.grad
    assert grad is not None
    grad = grad.clone()
    model.zero_grad()
    keys = list(model.state_dict())
    model.make_stateless()
    layer = model.embed_tokens
    assert type(layer) is StatelessScaledEmbedding and isinstance(layer, StatelessEmbedding)
    assert [name for name, _ in model.named_parameters()] == ["shared_embed_weight"]
    assert "embed_tokens.embed_scale" in dict(model.named_buffers())  # moves with .to(); not saved, as stock
    assert list(runtime.stateful_state_dict(model)) == keys
    actual = model(IDS)
    actual.sum().backward()
    assert torch.equal(actual, expected)
    assert torch.equal(model.shared_embed_weight.grad, grad)
    graph = torch.fx.symbolic_trace(model)
    assert torch.equal(graph(IDS), expected)


def test_make_stateful_gives_the_original_module_back() -> None:
    model = toy()
    original, parameter = model.embed_tokens, model.embed_tokens.weight
    expected = model(IDS)
    model.make_stateless()
    model.embed_tokens.embed_scale = torch.tensor(2.0)  # what the stateless form holds now comes back
    runtime.make_stateful(model)
    assert model.embed_tokens is original and original.weight is parameter and model.lm_head.weight is parameter
    assert torch.equal(original.get_buffer("embed_scale"), torch.tensor(2.0))
    original.embed_scale = torch.tensor(8**0.5)
    assert torch.equal(model(IDS), expected)


def test_the_scale_is_cast_to_the_weight_dtype_first() -> None:
    """bfloat16: sqrt(3072) = 55.4256 is 55.5 once cast, as in stock; a Python float multiplier would differ."""
    model = toy(dim=3072, dtype=torch.bfloat16)
    expected = model.embed_tokens(IDS)
    model.make_stateless()
    actual = model.embed_tokens(model.shared_embed_weight, IDS)
    assert torch.equal(actual, expected)
    assert not torch.equal(actual, nn.functional.embedding(IDS, model.get_parameter("shared_embed_weight")) * 3072**0.5)


def test_an_embedding_without_a_scale_is_refused_and_nothing_changes() -> None:
    torch.manual_seed(0)
    model = Toy(nn.Embedding(11, 8, 0))
    with pytest.raises(TypeError, match="neither a 0-dim embed_scale buffer nor a number"):
        model.make_stateless()
    assert type(model.embed_tokens) is nn.Embedding and [n for n, _ in model.named_parameters()] == [
        "embed_tokens.weight"]


def test_already_stateless_is_a_no_op() -> None:
    model = toy()
    model.make_stateless()
    layer = model.embed_tokens
    assert model.make_stateless() is model and model.embed_tokens is layer


class NumberScaledEmbedding(nn.Embedding):  # BartScaledWordEmbedding's computation (4.46 on): a plain float
    def __init__(self, num: int, dim: int, padding_idx: int, embed_scale: float) -> None:
        super().__init__(num, dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


@pytest.mark.parametrize("scale", [8**0.5, 1.0])
def test_a_number_scale_is_kept_and_given_back(scale: float) -> None:
    torch.manual_seed(0)
    model = Toy(NumberScaledEmbedding(11, 8, 0, scale))
    expected = model(IDS)
    expected.sum().backward()
    grad = model.embed_tokens.weight.grad
    assert grad is not None
    model.zero_grad()
    model.make_stateless()
    layer = model.embed_tokens
    assert isinstance(layer, StatelessScaledEmbedding) and layer.embed_scale == scale and not dict(layer.named_buffers())
    actual = model(IDS)
    assert torch.equal(actual, expected)
    actual.sum().backward()
    assert torch.equal(model.get_parameter("shared_embed_weight").grad, grad)
    if scale != 1.0:  # the scale really is applied: without it the output differs
        unscaled = nn.functional.embedding(IDS, model.get_parameter("shared_embed_weight"))
        assert not torch.equal(layer(model.get_parameter("shared_embed_weight"), IDS), unscaled)
    runtime.make_stateful(model)
    assert type(model.embed_tokens) is NumberScaledEmbedding and model.embed_tokens.embed_scale == scale
    assert torch.equal(model(IDS), expected)
