"""stateless.causal_masks.prepare_4d_causal_attention_mask: HF 4.40's eager mask (Qwen2, Mistral) by hand.

Equality with stock 4.40.2 on the tiny models is the release worker's (tests/releases/test_llm_releases.py);
here the rule it implements is spelled out on small tensors: causal, a window of ``sliding_window + 1`` keys,
padding wherever the mask is not exactly 1, and fx records it.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx

from stateless.causal_masks import prepare_4d_causal_attention_mask

MIN = torch.finfo(torch.float32).min


def expected(allowed: list[list[bool]]) -> torch.Tensor:
    return torch.where(torch.tensor(allowed), 0.0, MIN)


def test_causal_window_and_padding() -> None:
    embeds = torch.zeros(2, 4, 3)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 2, 1]])  # 2 is not 1: masked, as HF's 1 - mask != 0
    got = prepare_4d_causal_attention_mask(mask, (2, 4), embeds, 0, sliding_window=1)
    # window 1: a query sees itself and the key before it (HF 4.40's tril(diagonal=-window-1) is masked)
    window = [[k <= q and k >= q - 1 for k in range(4)] for q in range(4)]
    first = [[w and k != 0 for k, w in enumerate(row)] for row in window]
    second = [[w and k != 2 for k, w in enumerate(row)] for row in window]
    assert torch.equal(got, torch.stack([expected(first), expected(second)])[:, None])
    plain = prepare_4d_causal_attention_mask(None, (2, 4), embeds, 0)
    assert torch.equal(plain, expected([[k <= q for k in range(4)] for q in range(4)]).expand(2, 1, 4, 4))


def test_fx_records_it() -> None:
    def build(mask: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        return prepare_4d_causal_attention_mask(mask, embeds.shape[:2], embeds, 0, sliding_window=2)

    graph = torch.fx.symbolic_trace(build)
    for batch, seq in ((2, 5), (3, 8)):
        mask, embeds = torch.ones(batch, seq, dtype=torch.long), torch.zeros(batch, seq, 4)
        mask[0, :2] = 0
        assert torch.equal(graph(mask, embeds), build(mask, embeds))


@pytest.mark.parametrize(("mask", "past", "message"), [
    (torch.ones(2, 1, 4, 4), 0, "attention_mask has 4 dimensions"),
    (torch.ones(2, 4), 3, "past_key_values_length 3 is not supported"),
])
def test_refuses_what_a_cacheless_2d_mask_is_not(mask: torch.Tensor, past: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        prepare_4d_causal_attention_mask(mask, (2, 4), torch.zeros(2, 4, 3), past)
