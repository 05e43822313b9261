"""Each family's generated model is the stock transformers model: bit for bit, in eval and in training.

Family-generic: the families are tests/model_families.py's GENERIC list (T5 has its own files).
"""

from __future__ import annotations

import pytest
import torch
from support.model_checks import Family, assert_equal_gradients, eval_outputs, train_step
from support.model_families import GENERIC

CASES = [(family, config_name, class_name, path) for family in GENERIC for config_name in family.configs
         for class_name, path in family.cases()]
IDS = [f"{f.name}-{c}-{cls}-{p}" for f, c, cls, p in CASES]


@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
@pytest.mark.parametrize("family,config_name,class_name,path", CASES, ids=IDS)
def test_eval_outputs_are_equal(family: Family, config_name: str, class_name: str, path: str, masks: bool) -> None:
    reference, converted = family.pair(class_name, config_name)
    kwargs = family.call_kwargs(class_name, family.make_inputs(masks, config_name=config_name), path)
    actual, expected = eval_outputs(family, class_name, reference, converted, kwargs)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
@pytest.mark.parametrize("family,config_name,class_name,path", CASES, ids=IDS)
def test_train_mode_loss_and_every_gradient_are_equal(family: Family, config_name: str, class_name: str, path: str,
                                                      masks: bool) -> None:
    reference, converted = family.pair(class_name, config_name)
    kwargs = family.call_kwargs(class_name, family.make_inputs(masks, config_name=config_name), path)
    actual, expected = train_step(family, class_name, reference, converted, kwargs)
    assert torch.equal(actual, expected)
    assert assert_equal_gradients(converted, reference) > 10


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_dropout_is_really_active_in_train_mode(family: Family) -> None:
    """Guards the train-mode test against comparing two dropout-free runs."""
    class_name = family.model_family.definition.default_class
    _, converted = family.pair(class_name, family.configs[1])
    path = family.paths[class_name][0]
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=family.configs[1]), path)
    converted.train()
    torch.manual_seed(1)
    first = converted(**kwargs)
    torch.manual_seed(2)
    assert not torch.equal(first, converted(**kwargs))


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_state_dict_keys_are_hf_keys(family: Family) -> None:
    for class_name in family.classes:
        for config_name in family.configs:
            reference, converted = family.pair(class_name, config_name)
            assert list(converted.state_dict()) == list(reference.state_dict())


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_pretrained_round_trip(family: Family, tmp_path) -> None:
    class_name = family.model_family.definition.default_class
    reference, _ = family.pair(class_name, family.configs[0])
    reference.save_pretrained(tmp_path)
    loaded = getattr(family.generated, class_name).from_pretrained(tmp_path)
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=family.configs[0]),
                                family.paths[class_name][0])
    actual, expected = eval_outputs(family, class_name, reference, loaded, kwargs)
    assert torch.equal(actual, expected)
