"""The layer_drop transform on HF 5.x's LayerDrop: drawn in training only when the probability is positive,
the encoder's layer held in ``if not to_drop:`` -> ``stateless.LayerDrop("torch_positive")``."""

from __future__ import annotations

from textwrap import dedent, indent

import pytest
import torch
from support.transform_helpers import assert_rewrites, assert_unchanged

from stateless.layerdrop import LayerDrop
from transforms.layer_drop import LayerDropLoop

HEAD = """\
import math

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layerdrop = config.layerdrop
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, hidden_states, attention_mask):
        for idx, layer in enumerate(self.layers):
"""
AFTER_HEAD = HEAD.replace("from torch import nn\n", "from torch import nn\nimport stateless\n") \
    .replace("range(2)])\n", "range(2)])\n        self.layer_drop = stateless.LayerDrop(\"torch_positive\")\n")
TAIL = "        return hidden_states * math.e\n"
AFTER = AFTER_HEAD + indent("""\
dropped = self.layer_drop(self.layerdrop, hidden_states)

def run_layer(hidden_states):
    hidden_states = layer(hidden_states, attention_mask)
    return hidden_states

hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
""", " " * 12) + TAIL


def loop(body: str) -> str:
    return HEAD + indent(dedent(body), " " * 12) + TAIL


def test_flag_form_with_not_flag() -> None:
    # BART's encoder, 5.x.
    assert_rewrites(LayerDropLoop, loop("""\
        to_drop = False
        if self.training and self.layerdrop > 0.0:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:  # skip the layer
                to_drop = True

        if not to_drop:
            hidden_states = layer(hidden_states, attention_mask)
        """), AFTER)
    assert_unchanged(LayerDropLoop, AFTER)  # idempotent


def test_continue_form() -> None:
    # BART's decoder, 5.x.
    assert_rewrites(LayerDropLoop, loop("""\
        if self.training and self.layerdrop > 0.0:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:
                continue

        hidden_states = layer(hidden_states, attention_mask)
        """), AFTER)


@pytest.mark.parametrize("gate", [
    "self.training and self.other > 0.0",  # gated on another number than the one compared
    "self.training and self.layerdrop > 0.5",  # not "positive"
    "self.training or self.layerdrop > 0.0",
])
def test_other_gates_are_left_alone(gate: str) -> None:
    assert_unchanged(LayerDropLoop, loop(f"""\
        if {gate}:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:
                continue
        hidden_states = layer(hidden_states, attention_mask)
        """))


def test_torch_positive_draws_as_stock_does() -> None:
    """Stock 5.x draws torch.rand([]) in training only when p > 0: the generator after the decisions is stock's."""
    gate = LayerDrop("torch_positive")
    like = torch.zeros(())
    for p, training in [(0.0, True), (0.3, True), (0.3, False), (0.0, False)]:
        gate.train(training)
        torch.manual_seed(1)
        decision = gate(p, like)
        after = torch.rand([])
        torch.manual_seed(1)
        stock = False
        if training and p > 0.0:
            stock = bool(torch.rand([]) < p)
        assert bool(decision) == stock
        assert torch.equal(after, torch.rand([]))
