"""BART's LayerDrop in train mode with ``layerdrop > 0``: what the generated code does (stateless/layerdrop.py).

Eagerly the generated model draws from Python's ``random`` where stock does and skips the same layers: with the
same ``random`` and torch seeds the loss and every gradient are equal, and so is which layers get none.  A traced
graph (fx, torch.export strict and non-strict) draws anew on every call instead of baking the draw it saw while
tracing; without dropout its values equal stock's for the same ``random`` seed, and an fx graph traced in train
mode stops dropping after ``.eval()``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from support.bart_models import BART, call_kwargs, config, generated, inputs, stock
from support.model_checks import assert_equal_gradients, fx_trace, scalar

CLASS = "BartForConditionalGeneration"
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def pair(layerdrop: float, **overrides: object) -> tuple[Any, Any]:  # stock and generated: models mypy cannot see
    cfg = config("2layer-untied", encoder_layers=4, decoder_layers=4, encoder_layerdrop=layerdrop,
                 decoder_layerdrop=layerdrop, **overrides)
    torch.manual_seed(0)
    reference = stock.BartForConditionalGeneration(cfg)
    converted = generated.BartForConditionalGeneration(cfg)
    converted.load_state_dict(reference.state_dict())
    return reference, converted


def seeded(model: torch.nn.Module, kwargs: dict, seed: int) -> Any:  # the generated loss or stock's ModelOutput
    random.seed(seed)
    torch.manual_seed(seed)
    return model(**kwargs)


def dropped_layers(model: torch.nn.Module) -> set[str]:
    """The layers whose parameters got no gradient (skipped by LayerDrop)."""
    return {name.rsplit(".", 2)[0].split(".self_attn")[0] for name, p in model.named_parameters()
            if ".layers." in name and p.grad is None}


@pytest.mark.parametrize("form", ["stateful", "stateless"])
def test_eager_train_mode_drops_the_same_layers_as_stock(form: str) -> None:
    kwargs = call_kwargs(CLASS, inputs(True), "labels")
    seen: set[frozenset[str]] = set()
    for seed in range(6):
        reference, converted = pair(0.4)
        renamed: dict[str, str] = {}
        if form == "stateless":
            converted.make_stateless()
            weight, key = BART.shared_weight(CLASS), BART.shared_key(CLASS)
            assert weight is not None and key is not None  # BART shares its embedding
            renamed = {weight: key}
        reference.train(), converted.train()
        expected, actual = seeded(reference, kwargs, seed), seeded(converted, kwargs, seed)
        assert torch.equal(actual, expected.loss)
        scalar(expected.loss).backward(), scalar(actual).backward()
        assert_equal_gradients(converted, reference, renamed)  # None-ness included: the same layers dropped
        assert dropped_layers(converted) == dropped_layers(reference)
        seen.add(frozenset(dropped_layers(reference)))
    assert len(seen) >= 3  # the draws really vary which layers drop


def test_eval_mode_never_drops_and_keeps_random_in_step() -> None:
    reference, converted = pair(0.9)
    reference.eval(), converted.eval()
    kwargs = call_kwargs(CLASS, inputs(True), "logits")
    with torch.no_grad():
        assert torch.equal(seeded(converted, kwargs, 3), seeded(reference, kwargs, 3).logits)
    random.seed(3)
    with torch.no_grad():
        converted(**kwargs)
    after_converted = random.random()
    random.seed(3)
    with torch.no_grad():
        reference(**kwargs)
    assert after_converted == random.random()  # one draw per layer, as stock


def test_fx_graph_draws_anew_on_every_call_and_follows_eval() -> None:
    reference, converted = pair(0.5, **NO_DROPOUT)
    kwargs = call_kwargs(CLASS, inputs(True), "labels")
    reference.train(), converted.train()
    graph = fx_trace(converted, kwargs)
    assert any("_decide" in str(node.target) for node in graph.graph.nodes)
    losses = set()
    with torch.no_grad():
        for seed in range(6):
            expected = seeded(reference, kwargs, seed).loss
            actual = seeded(graph, kwargs, seed)
            assert torch.equal(actual, expected), seed
            losses.add(actual.item())
        assert len(losses) > 2  # not one draw baked into the graph
        graph.eval(), reference.eval()
        for seed in range(2):
            assert torch.equal(seeded(graph, kwargs, seed), seeded(reference, kwargs, seed).loss)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_exported_graph_draws_anew_on_every_call(strict: bool) -> None:
    reference, converted = pair(0.5, **NO_DROPOUT)
    kwargs = call_kwargs(CLASS, inputs(True), "labels")
    reference.train(), converted.train()
    random.seed(0)
    exported = torch.export.export(converted, (), kwargs, strict=strict).module()
    assert sum(node.target is torch.ops.stateless.layer_drop.default for node in exported.graph.nodes) == 8
    losses = set()
    with torch.no_grad():
        for seed in range(6):
            actual = seeded(exported, kwargs, seed)
            assert torch.equal(actual, seeded(reference, kwargs, seed).loss), seed
            losses.add(actual.item())
    assert len(losses) > 2
