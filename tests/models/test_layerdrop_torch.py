"""stateless.LayerDrop("torch"): HF 4.35 on draw ``torch.rand([])`` per layer, in training only.

Eagerly the decision is stock's: the same torch draws at the same points (so later dropout masks are stock's
too), none in eval.  A graph traced in train mode draws anew on every call, and an fx graph stops dropping after
``.eval()``; torch.export (non-strict) records the draw, where stock BART 4.57 fails on its data-dependent branch.
"""

from __future__ import annotations

import torch
from torch import nn

import stateless

P = 0.5


class Stock(nn.Module):
    """The stock idiom (BART's decoder loop, 4.35 on) over four layers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
        self.dropout = nn.Dropout(0.3)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training:
                dropout_probability = torch.rand([])
                if dropout_probability < P:
                    continue
            hidden_states = self.dropout(layer(hidden_states))
        return hidden_states


class Generated(Stock):
    """What the layer_drop transform makes of it."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_drop = stateless.LayerDrop("torch")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            dropped = self.layer_drop(P, hidden_states)

            def run_layer(hidden_states: torch.Tensor, layer: nn.Module = layer) -> torch.Tensor:
                return self.dropout(layer(hidden_states))

            hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
        return hidden_states


def models() -> tuple[Stock, Generated]:
    torch.manual_seed(0)
    reference = Stock()
    converted = Generated()
    converted.load_state_dict(reference.state_dict())
    return reference, converted


def test_eager_draws_as_stock_in_train_and_not_in_eval() -> None:
    reference, converted = models()
    x = torch.randn(3, 4)
    outputs = set()
    for seed in range(8):
        torch.manual_seed(seed)
        expected = reference(x)
        torch.manual_seed(seed)
        actual = converted(x)
        assert torch.equal(actual, expected)
        outputs.add(actual.sum().item())
    assert len(outputs) > 1, "no seed dropped a layer"
    reference.eval(), converted.eval()
    torch.manual_seed(1)
    state = torch.get_rng_state()
    assert torch.equal(converted(x), reference(x))
    assert torch.equal(torch.get_rng_state(), state), "eval drew from the generator"


def test_traced_graphs_draw_per_call_and_follow_the_mode() -> None:
    _, converted = models()
    x = torch.randn(3, 4)
    converted.train()
    graph = torch.fx.symbolic_trace(converted)
    exported = torch.export.export(converted, (x,), strict=False).module()
    for traced in (graph, exported):
        results = {traced(x).sum().item() for _ in range(12)}
        assert len(results) > 1, "the decision was baked in"
    graph.eval(), converted.eval()
    assert torch.equal(graph(x), converted(x))
