"""Each family's stateless form: one shared parameter, still the stock model bit for bit, HF keys both ways.

Family-generic: the families are tests/model_families.py's GENERIC list (T5 has test_stateless.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.model_checks import Family, assert_equal_gradients, eval_outputs, fx_trace, shared_weight_uses, train_step
from support.model_families import GENERIC

from stateless import StatelessEmbedding, StatelessLinear

CASES = [(family, config_name, class_name) for family in GENERIC for config_name in family.configs
         for class_name in family.classes]
IDS = [f"{f.name}-{c}-{cls}" for f, c, cls in CASES]


def tied(family: Family, class_name: str, config_name: str) -> bool:
    """Whether the class's head shares the weight under this config (read off the recipe, as the IPU target does)."""
    (weight,) = family.model_family.definition.shared[class_name]
    return weight.tied(family.make_config(config_name).to_dict())


def stateless_pair(family: Family, class_name: str, config_name: str) -> tuple[Any, Any]:  # as Family.pair's
    reference, converted = family.pair(class_name, config_name)
    return reference, converted.make_stateless()


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_exactly_one_parameter_holds_the_shared_weight(family: Family, config_name: str, class_name: str) -> None:
    reference, converted = family.pair(class_name, config_name)
    key = family.shared_key(class_name)
    shared = converted.get_parameter(key)
    converted.make_stateless()
    assert [name for name, p in converted.named_parameters() if p is shared] == [family.shared_weight(class_name)]
    pointers = [p.data_ptr() for p in converted.parameters()]
    assert len(pointers) == len(set(pointers)), "a parameter is duplicated"
    assert sum(p.numel() for p in converted.parameters()) == sum(p.numel() for p in reference.parameters())
    (weight,) = family.model_family.definition.shared[class_name]
    assert all(isinstance(converted.get_submodule(user), StatelessEmbedding) for user in weight.users)
    if weight.tied_linear is not None:
        assert isinstance(converted.get_submodule(weight.tied_linear), StatelessLinear) == tied(
            family, class_name, config_name)
    assert converted.make_stateless() is converted  # a second call is a no-op
    assert [name for name, p in converted.named_parameters() if p is shared] == [family.shared_weight(class_name)]


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_eval_outputs_equal_stock(family: Family, config_name: str, class_name: str) -> None:
    reference, converted = stateless_pair(family, class_name, config_name)
    for path in family.paths[class_name]:
        kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name), path)
        actual, expected = eval_outputs(family, class_name, reference, converted, kwargs)
        assert torch.equal(actual, expected), path


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_train_loss_and_every_gradient_equal_stock(family: Family, config_name: str, class_name: str) -> None:
    reference, converted = stateless_pair(family, class_name, config_name)
    path = family.paths[class_name][-1]  # the richest path (token types, where the family has them)
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name), path)
    actual, expected = train_step(family, class_name, reference, converted, kwargs)
    assert torch.equal(actual, expected)
    weight, key = family.shared_weight(class_name), family.shared_key(class_name)
    assert weight is not None and key is not None  # CASES: the classes that share a weight
    assert assert_equal_gradients(converted, reference, {weight: key}) > 10
    assert converted.get_parameter(weight).grad.abs().sum() > 0


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_hf_keyed_state_dict_round_trips_into_the_stock_class(family: Family, config_name: str,
                                                              class_name: str) -> None:
    reference, converted = stateless_pair(family, class_name, config_name)
    state = converted.stateful_state_dict()
    assert set(state) == set(reference.state_dict())
    torch.manual_seed(99)  # different initial weights: the load must overwrite all of them
    restored = getattr(family.stock, class_name)(family.make_config(config_name))
    restored.load_state_dict(state, strict=True)
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name),
                                family.paths[class_name][0])
    reference.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(family.reference_output(class_name, restored(**kwargs), kwargs),
                           family.reference_output(class_name, reference(**kwargs), kwargs))


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_stateless_model_loads_a_stock_checkpoint_and_goes_back(family: Family, config_name: str,
                                                                class_name: str) -> None:
    reference, _ = family.pair(class_name, config_name)
    torch.manual_seed(42)
    fresh = getattr(family.generated, class_name)(family.make_config(config_name)).make_stateless()
    fresh.load_state_dict(reference.state_dict(), strict=True)
    weight = fresh.get_parameter(family.shared_weight(class_name))
    assert torch.equal(weight, reference.get_parameter(family.shared_key(class_name)))
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name),
                                family.paths[class_name][0])
    actual, expected = eval_outputs(family, class_name, reference, fresh, kwargs)
    assert torch.equal(actual, expected)
    fresh.make_stateful()
    assert list(fresh.state_dict()) == list(reference.state_dict())
    assert fresh.get_parameter(family.shared_key(class_name)) is weight
    actual, expected = eval_outputs(family, class_name, reference, fresh, kwargs)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("family,config_name,class_name", CASES, ids=IDS)
def test_fx_trace_has_one_shared_weight_input_used_by_every_consumer(family: Family, config_name: str,
                                                                     class_name: str) -> None:
    _, converted = stateless_pair(family, class_name, config_name)
    path = family.paths[class_name][-1]
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name), path)
    graph = fx_trace(converted.eval(), kwargs).graph
    weight = family.model_family.definition.shared[class_name][0]
    # Every embedding call (GPT-2 embeds token types with wte too) and the tied head.
    embedding_calls = sum(1 for name in family.embedded_inputs if name in kwargs)
    expected = embedding_calls + tied(family, class_name, config_name)
    assert shared_weight_uses(graph, weight.weight) == expected
    stock_key = family.shared_key(class_name)
    assert not [n for n in graph.nodes if n.op == "get_attr" and n.target == stock_key]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_export_has_one_shared_weight_input(family: Family, strict: bool) -> None:
    class_name = family.model_family.definition.default_class
    config_name = family.configs[0]
    assert tied(family, class_name, config_name)
    _, converted = stateless_pair(family, class_name, config_name)
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name),
                                family.paths[class_name][0])
    program = torch.export.export(converted.eval(), (), kwargs, strict=strict)
    weight = family.shared_weight(class_name)
    targets = program.graph_signature.inputs_to_parameters
    placeholders = [name for name, target in targets.items() if target == weight]
    assert len(placeholders) == 1 and family.shared_key(class_name) not in targets.values()
    node = next(n for n in program.graph.nodes if n.name == placeholders[0])
    assert len(node.users) >= 2
    with torch.no_grad():
        assert torch.equal(program.module()(**kwargs), converted(**kwargs))


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_from_pretrained_then_make_stateless(family: Family, tmp_path) -> None:
    class_name = family.model_family.definition.default_class
    config_name = family.configs[1]
    reference, _ = family.pair(class_name, config_name)
    reference.save_pretrained(tmp_path)
    loaded = getattr(family.generated, class_name).from_pretrained(tmp_path).make_stateless()
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name),
                                family.paths[class_name][0])
    actual, expected = eval_outputs(family, class_name, reference, loaded, kwargs)
    assert torch.equal(actual, expected)
