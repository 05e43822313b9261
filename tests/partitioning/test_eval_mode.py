"""partitioning/gpu/eval_mode.py: a stage graph traced in train mode evaluates as eval mode, trains as before."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import Pipe

from partitioning.gpu.eval_mode import evaluating, switchable


class Model(nn.Module):
    def __init__(self, draw: bool = False) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8)
        self.draw = draw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.dropout(self.drop(self.a(x)), 0.3, self.training)
        if self.draw:  # a layer drop's decision: a draw no dropout switch can turn off
            x = x * (torch.rand(()) > 0.1)
        return self.b(x).sum()


def traced(model: nn.Module) -> nn.Module:
    return Pipe.from_tracing(model.train(), (torch.ones(4, 8),)).get_stage_module(0)


def test_eval_mode_inside_evaluating_and_the_same_draws_outside() -> None:
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(4, 8)
    stage, original = traced(model), traced(model)
    assert switchable(stage) == []
    with evaluating():
        evaluated = stage(x)
    assert torch.equal(evaluated, model.eval()(x))
    torch.manual_seed(1)
    trained = stage(x)
    torch.manual_seed(1)
    assert torch.equal(trained, original(x)) and not torch.equal(trained, evaluated)


def test_a_random_draw_that_is_no_dropout_is_named() -> None:
    left = switchable(traced(Model(draw=True)))
    assert len(left) == 1 and "aten.rand" in left[0], left


class Attention(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        dropout = 0.5 if self.training else 0.0  # as transformers' attention passes its dropout
        return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=dropout).sum()


def test_attention_dropout_is_zero_inside_evaluating() -> None:
    q = torch.randn(1, 2, 4, 8)
    stage = Pipe.from_tracing(Attention().train(), (q,)).get_stage_module(0)
    assert switchable(stage) == []
    with evaluating():
        assert torch.equal(stage(q), Attention().eval()(q))
    assert not torch.equal(stage(q), Attention().eval()(q))
