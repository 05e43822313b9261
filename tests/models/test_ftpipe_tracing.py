"""Generated models trace under FTPipe's tracer semantics (tests/ftpipe_standin.py) and compute what eager does.

FTPipe wraps every value a parent passes (``None`` included) and every
submodule, so the generated code's ``None`` checks, its dispatch on stateless
layers and its passing of the shared weight must all work on wrappers.  A
family joins these tests by adding a row to FAMILIES.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
import torch
from support import bart_models, ftpipe_standin
from support.model_checks import Family as ModelFamily
from support.model_families import BERT, GPT2, ROBERTA
from support.t5_models import call_kwargs, config, generated, inputs
from torch import nn

import stateless
from families.models import SharedWeight


@dataclass(frozen=True)
class Family:
    module: ModuleType  # the generated modeling module
    configs: tuple[str, ...]  # names its test helper builds configurations from
    build: Callable[[str, str], nn.Module]  # (class name, config name) -> model, seeded
    calls: tuple[tuple[str, str], ...]  # (class name, forward path)
    call_inputs: Callable[[str, str, int], dict[str, Any]]  # (class name, path, seed) -> forward kwargs
    shared_weight: str | None  # the top-level parameter of the stateless form, if the family has one


def _t5_model(class_name: str, config_name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(generated, class_name)(config(config_name))


def _bart_model(class_name: str, config_name: str) -> nn.Module:
    torch.manual_seed(0)
    return getattr(bart_models.generated, class_name)(bart_models.config(config_name))


def _generic(family: ModelFamily, configs: tuple[str, ...], calls: tuple[tuple[str, str], ...]) -> Family:
    """A row for a family of tests/model_families.py: its generated module, configurations and inputs."""
    def build(class_name: str, config_name: str) -> nn.Module:
        torch.manual_seed(0)
        return getattr(family.generated, class_name)(family.make_config(config_name))

    def call_inputs(class_name: str, path: str, seed: int) -> dict[str, Any]:
        return family.call_kwargs(class_name, family.make_inputs(True, seed=seed), path)

    return Family(module=family.generated, configs=configs, build=build, calls=calls, call_inputs=call_inputs,
                  shared_weight="shared_embed_weight")


FAMILIES = {
    "t5": Family(
        module=generated,
        configs=("2layer-gelu-tied", "3layer-relu-untied-2dec"),
        build=_t5_model,
        calls=(("T5ForConditionalGeneration", "labels"), ("T5ForConditionalGeneration", "labels-only"),
               ("T5ForConditionalGeneration", "logits"), ("T5Model", "hidden"), ("T5EncoderModel", "hidden")),
        call_inputs=lambda class_name, path, seed: call_kwargs(class_name, inputs(True, seed=seed), path),
        shared_weight="shared_embed_weight",
    ),
    "bart": Family(
        module=bart_models.generated,
        configs=("2layer-untied", "3layer-tied-relu-2dec"),
        build=_bart_model,
        calls=(("BartForConditionalGeneration", "labels"), ("BartForConditionalGeneration", "labels-only"),
               ("BartForConditionalGeneration", "logits"), ("BartModel", "shifted"), ("BartModel", "hidden")),
        call_inputs=lambda class_name, path, seed: bart_models.call_kwargs(
            class_name, bart_models.inputs(True, seed=seed), path),
        shared_weight="shared_embed_weight",
    ),
    # no cross-attention configuration: the calls take no encoder hidden states
    "gpt2": _generic(GPT2, ("1layer-tied", "2layer-untied"), tuple(GPT2.cases())),
    # tied and untied heads, relative positions; token type and position ids on the token-types path
    "bert": _generic(BERT, ("2layer-relative-key-query", "2layer-untied-relu"), tuple(BERT.cases())),
    "roberta": _generic(ROBERTA, ("2layer-relative-key-query", "2layer-untied-relu"), tuple(ROBERTA.cases())),
}

CASES = [
    pytest.param(family, class_name, path, config_name, form, id=f"{family}-{class_name}-{path}-{config_name}-{form}")
    for family, spec in FAMILIES.items()
    for class_name, path in spec.calls
    for config_name in spec.configs
    for form in (("stateful", "stateless") if spec.shared_weight else ("stateful",))
]


def prepared(family: str, class_name: str, config_name: str, form: str) -> nn.Module:
    model = FAMILIES[family].build(class_name, config_name).eval()
    if form == "stateless":
        assert isinstance(model, SharedWeight)
        model.make_stateless()
    return model


def eager(model: nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model(**kwargs)


@pytest.mark.parametrize("family,class_name,path,config_name,form", CASES)
def test_ftpipe_trace_runs_like_eager(family: str, class_name: str, path: str, config_name: str, form: str) -> None:
    spec = FAMILIES[family]
    model = prepared(family, class_name, config_name, form)
    traced_inputs, fresh_inputs = spec.call_inputs(class_name, path, 1), spec.call_inputs(class_name, path, 2)
    graph = ftpipe_standin.trace(model, traced_inputs)
    # The traced run and the recorded program both compute eager's result, and the program is not
    # specialised to the traced values: FTPipe's partitions are generated from this graph.
    assert torch.equal(graph.run(**traced_inputs), eager(model, traced_inputs))
    assert torch.equal(graph.run(**fresh_inputs), eager(model, fresh_inputs))
    assert all(not isinstance(m, ftpipe_standin.Layer) for m in model.modules()), "model not restored"
    if form == "stateless":
        # One graph input holds the shared weight; every stateless layer receives it.
        assert spec.shared_weight is not None  # stateless cases exist only for families with one
        weight = getattr(model, spec.shared_weight)
        holders = [i for i, node in enumerate(graph.nodes) if node.kind == "parameter" and node.target is weight]
        layers = [m for m in model.modules() if getattr(m, "takes_shared_weight", False)]
        assert len(holders) == 1
        # each layer consumes it, once per call (GPT-2 embeds token types with the shared embedding too); a
        # model holding it reads its dtype too (stateless.module_dtype), nothing else
        consumers = graph.consumers(holders[0])
        users = [node for node in consumers if node.kind == "module"]
        assert {id(node.target) for node in users} == {id(layer) for layer in layers} and len(layers) >= 1
        assert all(node.target is getattr and node.args[1:] == ("dtype",) for node in consumers if node not in users)


# -- the stand-in itself: the semantics the cases above rely on ------------------------------------------------


class _Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = stateless.StatelessLinear(3, 2)
        self.weight = nn.Parameter(torch.randn(2, 3))
        self.seen: list[Any] = []

    def forward(self, x: torch.Tensor, maybe: Any = None) -> torch.Tensor:
        self.seen = [maybe is None, stateless.is_None(maybe), stateless.is_not_None(maybe),
                     isinstance(self.inner, stateless.StatelessLinear), self.inner.in_features]
        return stateless.call_shared(self.inner, self.weight, x)


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.holder = _Holder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.holder(x, None)


def test_standin_wraps_none_and_submodules_and_unwraps_only_registered_identity_checks() -> None:
    model = _Outer()
    x = torch.randn(4, 3)
    graph = ftpipe_standin.trace(model, {"x": x})
    # A wrapped None is not None to `is`; operator.is_/is_not (what stateless uses) see the real value;
    # the wrapped submodule is no instance of its class but forwards attribute reads.
    assert model.holder.seen == [False, True, False, False, 3]
    assert torch.equal(graph.run(x=x), model(x))
    assert operator.is_.__module__ == "_operator" and not isinstance(model.holder, ftpipe_standin.Layer)


def test_standin_without_the_t5_registrations_compares_wrappers() -> None:
    model = _Outer()
    ftpipe_standin.trace(model, {"x": torch.randn(4, 3)}, untraced=())
    assert model.holder.seen[1:3] == [False, True]  # what FTPipe does without the registration


def test_standin_refuses_an_untraced_tensor_passed_to_a_submodule() -> None:
    class Passes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.leaf = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # A leaf's parameter is not wrapped: FTPipe sees a tensor that no input produced.
            return self.leaf(self.leaf.weight.new_ones(4, 3))

    model = Passes()
    with pytest.raises(ftpipe_standin.TraceError, match="untraced tensor"):
        ftpipe_standin.trace(model, {"x": torch.randn(4, 3)})
    assert isinstance(model.leaf, nn.Linear), "model not restored after a failed trace"
    assert operator.is_.__module__ == "_operator"


def test_standin_discards_in_place_calls_whose_result_is_unused() -> None:
    class Fills(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mask = torch.full((2, 2), float("-inf"))
            mask.masked_fill_(torch.eye(2, dtype=torch.bool), 0)  # FTPipe discards it: nothing uses its result
            x += 1  # an in-place operator rebinds x: kept
            return x + mask

    x = torch.zeros(2, 2)
    graph = ftpipe_standin.trace(Fills(), {"x": x})
    assert [getattr(graph.nodes[i].target, "__name__", "") for i in sorted(graph.dropped)] == [
        "eye", ".masked_fill_"]  # the fill, and what only it used
    assert torch.equal(graph.run(x=x), torch.full((2, 2), float("-inf")))  # the mask as it was before the fill


def test_standin_wraps_dtypes_and_a_running_modules_own_parameters() -> None:
    class ReadsDtypes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.seen = [stateless.finfo(x.dtype).min, stateless.finfo_value(x.dtype, "max")]
            with pytest.raises(TypeError, match="floating point input type"):
                torch.finfo(x.dtype)
            with pytest.raises(NotImplementedError, match="tracing Parameter::__hash__ is currently not supported"):
                next(self.parameters())
            return x * self.weight

    model, x = ReadsDtypes(), torch.ones(2)
    graph = ftpipe_standin.trace(model, {"x": x})
    assert model.seen == [torch.finfo(torch.float32).min, torch.finfo(torch.float32).max]
    assert torch.equal(graph.run(x=x), x) and next(model.parameters()) is model.weight  # restored


def test_standin_records_branches_on_data_as_baked() -> None:
    class Branches(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 if x.sum() > 0 else x - 1

    x = torch.ones(2)
    graph = ftpipe_standin.trace(Branches(), {"x": x})
    assert len(graph.baked) == 1 and graph.baked[0] == "Branches: bool(gt(.sum(input#0), 0))"
    assert torch.equal(graph.run(x=-x), -x + 1)  # the recorded program keeps the branch taken


# -- each runtime behaviour the generated code relied on before fails under the stand-in ---------------------


def _identity_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    module = FAMILIES["t5"].module
    monkeypatch.setattr(module, "is_None", lambda value: value is None)
    monkeypatch.setattr(module, "is_not_None", lambda value: value is not None)


def _isinstance_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    def call_shared(module: nn.Module, weight: Any, *args: Any) -> Any:
        if isinstance(module, (stateless.StatelessEmbedding, stateless.StatelessLinear)):
            return module(weight, *args)
        return module(*args)
    monkeypatch.setattr(stateless, "call_shared", call_shared)


def _owned_weight_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    def shared_weight(model: nn.Module, shared: str, weight: str) -> Any:
        return getattr(model, weight) if stateless.is_stateless(model) else model.get_submodule(shared).weight
    monkeypatch.setattr(stateless, "shared_weight", shared_weight)


@pytest.mark.parametrize("old_behaviour,form,error", [
    (_identity_checks, "stateless", "cannot specify both"),
    (_isinstance_dispatch, "stateless", "missing 1 required positional argument"),
    (_owned_weight_passed, "stateful", "untraced tensor"),
], ids=["is-None-by-identity", "call_shared-by-isinstance", "stateful-weight-passed"])
def test_the_old_runtime_does_not_trace(monkeypatch: pytest.MonkeyPatch, old_behaviour, form: str,
                                        error: str) -> None:
    old_behaviour(monkeypatch)
    model = prepared("t5", "T5ForConditionalGeneration", "2layer-gelu-tied", form)
    with pytest.raises(Exception, match=error):
        ftpipe_standin.trace(model, call_kwargs("T5ForConditionalGeneration", inputs(True), "labels"))
