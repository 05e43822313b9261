"""The generated T5 is the stock transformers 4.5.1 T5: bit for bit, in eval and in training."""

from __future__ import annotations

import pytest
import torch
from support.model_checks import scalar
from support.t5_models import CLASSES, CONFIGS, call_kwargs, inputs, pair, reference_output

PATHS = {"T5ForConditionalGeneration": ("labels", "labels-only", "logits"),
         "T5Model": ("hidden",), "T5EncoderModel": ("hidden",)}
CASES = [(cls, path) for cls in CLASSES for path in PATHS[cls]]


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("class_name,path", CASES)
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
def test_eval_outputs_are_equal(config_name: str, class_name: str, path: str, masks: bool) -> None:
    reference, converted = pair(class_name, config_name)
    kwargs = call_kwargs(class_name, inputs(masks), path)
    reference.eval(), converted.eval()
    with torch.no_grad():
        expected = reference_output(class_name, reference(**kwargs), kwargs)
        actual = converted(**kwargs)
    assert isinstance(actual, torch.Tensor)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("class_name,path", CASES)
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
def test_train_mode_loss_and_every_gradient_are_equal(config_name: str, class_name: str, path: str,
                                                      masks: bool) -> None:
    reference, converted = pair(class_name, config_name)
    kwargs = call_kwargs(class_name, inputs(masks), path)
    reference.train(), converted.train()
    torch.manual_seed(1234)
    expected = scalar(reference_output(class_name, reference(**kwargs), kwargs))
    expected.backward()
    torch.manual_seed(1234)
    actual = scalar(converted(**kwargs))
    actual.backward()
    assert torch.equal(actual, expected)
    grads = dict(reference.named_parameters())
    compared = 0
    for name, parameter in converted.named_parameters():
        assert name in grads
        if grads[name].grad is None:
            assert parameter.grad is None, name
            continue
        assert torch.equal(parameter.grad, grads[name].grad), name
        compared += 1
    assert compared > 10


def test_dropout_is_really_active_in_train_mode() -> None:
    """Guards the train-mode test against comparing two dropout-free runs."""
    _, converted = pair("T5ForConditionalGeneration", "2layer-gelu-untied")
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
    converted.train()
    torch.manual_seed(1)
    first = converted(**kwargs)
    torch.manual_seed(2)
    assert not torch.equal(first, converted(**kwargs))


def test_state_dict_keys_are_hf_keys() -> None:
    for class_name in CLASSES:
        reference, converted = pair(class_name, "2layer-gelu-untied")
        assert list(converted.state_dict()) == list(reference.state_dict())


def test_pretrained_round_trip(tmp_path) -> None:
    reference, _ = pair("T5ForConditionalGeneration", "1layer-relu-tied")
    reference.save_pretrained(tmp_path)
    from support.t5_models import generated
    loaded = generated.T5ForConditionalGeneration.from_pretrained(tmp_path)
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "logits")
    reference.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(**kwargs), reference(**kwargs).logits)
