"""The stateless form: one shared parameter, still the stock model bit for bit, and partitionable."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.t5_models import CLASSES, call_kwargs, config, generated, inputs, pair, reference_output, stock
from torch import nn

from stateless import StatelessEmbedding, StatelessLinear
from stateless.torch_internals import own_children

TIED, UNTIED = "1layer-relu-tied", "2layer-gelu-untied"
PATH = {"T5ForConditionalGeneration": "labels", "T5Model": "hidden", "T5EncoderModel": "hidden"}


def stateless_pair(class_name: str, config_name: str) -> tuple[Any, Any]:  # as pair's: models mypy cannot see
    reference, converted = pair(class_name, config_name)
    return reference, converted.make_stateless()


def reference_grads(reference: nn.Module) -> dict[str, torch.Tensor | None]:
    """Gradients by stateless name: the shared weight's is stock ``shared.weight``'s."""
    grads = {name: p.grad for name, p in reference.named_parameters()}
    grads["shared_embed_weight"] = grads.pop("shared.weight")
    return grads


# -- layers -------------------------------------------------------------------

def test_stateless_embedding_keeps_every_setting_and_output() -> None:
    torch.manual_seed(0)
    embedding = nn.Embedding(20, 6, padding_idx=3, max_norm=1.5, norm_type=1.0, scale_grad_by_freq=True)
    layer = StatelessEmbedding.like(embedding)
    assert (layer.padding_idx, layer.max_norm, layer.norm_type, layer.scale_grad_by_freq) == (3, 1.5, 1.0, True)
    assert list(layer.parameters()) == []
    ids = torch.tensor([[1, 3, 5, 5], [19, 0, 3, 2]])
    weight = embedding.weight.detach().clone().requires_grad_()
    expected = embedding(ids)  # max_norm renormalizes rows in place, so compare against a fresh copy
    assert torch.equal(layer(weight, ids), expected)
    assert torch.equal(layer.to_embedding(nn.Parameter(weight.detach())).weight, weight.detach())


def test_stateless_linear_keeps_its_bias() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(5, 7)
    layer = StatelessLinear.like(linear)
    assert [name for name, _ in layer.named_parameters()] == ["bias"] and layer.bias is linear.bias
    x = torch.randn(3, 5)
    assert torch.equal(layer(linear.weight, x), linear(x))
    assert torch.equal(F.linear(x, layer.to_linear(linear.get_parameter("weight")).weight, linear.bias), linear(x))


# -- one parameter --------------------------------------------------------------

@pytest.mark.parametrize("config_name", [TIED, UNTIED])
@pytest.mark.parametrize("class_name", CLASSES)
def test_exactly_one_parameter_holds_the_shared_weight(class_name: str, config_name: str) -> None:
    reference, converted = pair(class_name, config_name)
    shared = converted.shared.weight
    converted.make_stateless()
    holders = [name for name, p in converted.named_parameters() if p is shared]
    assert holders == ["shared_embed_weight"]
    assert not hasattr(converted, "shared")
    pointers = [p.data_ptr() for p in converted.parameters()]
    assert len(pointers) == len(set(pointers)), "a parameter is duplicated"
    assert sum(p.numel() for p in converted.parameters()) == sum(p.numel() for p in reference.parameters())
    embeddings = [m for m in converted.modules() if isinstance(m, nn.Embedding)]
    assert all(m.num_embeddings == converted.config.relative_attention_num_buckets for m in embeddings)
    tied = class_name == "T5ForConditionalGeneration" and config_name == TIED
    assert isinstance(getattr(converted, "lm_head", None), StatelessLinear) == tied


@pytest.mark.parametrize("class_name", CLASSES)
def test_make_stateless_twice_is_a_no_op(class_name: str) -> None:
    _, converted = stateless_pair(class_name, TIED)
    before = {name: p for name, p in converted.named_parameters()}
    modules = [type(m) for m in converted.modules()]
    assert converted.make_stateless() is converted
    assert {name: p for name, p in converted.named_parameters()} == before
    assert [type(m) for m in converted.modules()] == modules


# -- equivalence ------------------------------------------------------------------

@pytest.mark.parametrize("config_name", [TIED, UNTIED])
@pytest.mark.parametrize("class_name", CLASSES)
def test_eval_outputs_equal_stock(class_name: str, config_name: str) -> None:
    reference, converted = stateless_pair(class_name, config_name)
    for path in ("labels", "logits") if class_name == "T5ForConditionalGeneration" else ("hidden",):
        kwargs = call_kwargs(class_name, inputs(True), path)
        reference.eval(), converted.eval()
        with torch.no_grad():
            assert torch.equal(converted(**kwargs), reference_output(class_name, reference(**kwargs), kwargs))


@pytest.mark.parametrize("config_name", [TIED, UNTIED])
@pytest.mark.parametrize("class_name", CLASSES)
def test_train_loss_and_every_gradient_equal_stock(class_name: str, config_name: str) -> None:
    reference, converted = stateless_pair(class_name, config_name)
    kwargs = call_kwargs(class_name, inputs(True), PATH[class_name])
    reference.train(), converted.train()
    torch.manual_seed(3)
    expected = reference_output(class_name, reference(**kwargs), kwargs).sum()
    expected.backward()
    torch.manual_seed(3)
    actual = converted(**kwargs).sum()
    actual.backward()
    assert torch.equal(actual, expected)
    grads = reference_grads(reference)
    for name, parameter in converted.named_parameters():
        expected_grad = grads[name]
        assert (parameter.grad is None) == (expected_grad is None), name
        if parameter.grad is not None and expected_grad is not None:
            assert torch.equal(parameter.grad, expected_grad), name
    # the shared gradient really is the sum of several uses, not one of them
    assert converted.shared_embed_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("config_name", [TIED, UNTIED])
def test_optimizer_steps_keep_every_use_identical(config_name: str) -> None:
    class_name = "T5ForConditionalGeneration"
    reference, converted = stateless_pair(class_name, config_name)
    kwargs = call_kwargs(class_name, inputs(True), "labels")
    optimizers = [torch.optim.Adam(model.parameters(), lr=1e-2) for model in (reference, converted)]
    reference.eval(), converted.eval()  # no dropout: compare the updates themselves
    for _ in range(3):
        for model, optimizer in zip((reference, converted), optimizers):
            optimizer.zero_grad()
            output = model(**kwargs)
            (output if isinstance(output, torch.Tensor) else output.loss).backward()
            optimizer.step()
    assert torch.equal(converted.shared_embed_weight, reference.shared.weight)
    assert reference.encoder.embed_tokens.weight is reference.shared.weight
    with torch.no_grad():
        assert torch.equal(converted(**kwargs), reference(**kwargs).loss)


# -- tracing -------------------------------------------------------------------------

def shared_uses_in_fx(module: nn.Module, kwargs: dict) -> int:
    from support.model_checks import fx_trace
    graph = fx_trace(module, kwargs).graph
    nodes = [n for n in graph.nodes if n.op == "get_attr" and n.target == "shared_embed_weight"]
    assert len(nodes) == 1, "the shared weight must be one graph input"
    assert not [n for n in graph.nodes if n.op == "get_attr" and "embed_tokens" in str(n.target)]
    return len(nodes[0].users)


@pytest.mark.parametrize("config_name,uses", [(TIED, 3), (UNTIED, 2)])
def test_fx_trace_has_one_shared_weight_input_used_by_every_consumer(config_name: str, uses: int) -> None:
    _, converted = stateless_pair("T5ForConditionalGeneration", config_name)
    converted.eval()
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
    assert shared_uses_in_fx(converted, kwargs) == uses


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_export_has_one_shared_weight_input_used_by_every_consumer(strict: bool) -> None:
    _, converted = stateless_pair("T5ForConditionalGeneration", TIED)
    converted.eval()
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
    program = torch.export.export(converted, (), kwargs, strict=strict)
    inputs_to_parameters = program.graph_signature.inputs_to_parameters
    placeholders = [name for name, target in inputs_to_parameters.items() if target == "shared_embed_weight"]
    assert len(placeholders) == 1
    assert not [t for t in inputs_to_parameters.values() if "embed_tokens" in t or t == "lm_head.weight"]
    node = next(n for n in program.graph.nodes if n.name == placeholders[0])
    assert len(node.users) >= 3
    with torch.no_grad():
        assert torch.equal(program.module()(**kwargs), converted(**kwargs))


# -- torch.distributed.pipelining --------------------------------------------------

def split(model: nn.Module, kwargs: dict):
    from torch.distributed.pipelining import SplitPoint, pipeline
    spec = {"encoder.block.1": SplitPoint.BEGINNING, "decoder": SplitPoint.BEGINNING}
    return pipeline(model, mb_args=(), mb_kwargs=kwargs, split_spec=spec)


def test_pipelining_splits_the_stateless_model_but_not_the_stock_one() -> None:
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
    reference, converted = stateless_pair("T5ForConditionalGeneration", UNTIED)
    with pytest.raises(Exception, match="not a descendant"):
        split(reference, dict(kwargs, return_dict=False))
    pipe = split(converted, kwargs)
    assert pipe.num_stages == 3


# -- the way back --------------------------------------------------------------------

@pytest.mark.parametrize("config_name", [TIED, UNTIED])
@pytest.mark.parametrize("class_name", CLASSES)
def test_hf_keyed_state_dict_round_trips_into_the_stock_class(class_name: str, config_name: str) -> None:
    reference, converted = stateless_pair(class_name, config_name)
    state = converted.stateful_state_dict()
    assert set(state) == set(reference.state_dict())
    torch.manual_seed(99)  # different initial weights: the load must overwrite all of them
    restored = getattr(stock, class_name)(config(config_name))
    restored.load_state_dict(state, strict=True)
    kwargs = call_kwargs(class_name, inputs(True), PATH[class_name])
    reference.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(reference_output(class_name, restored(**kwargs), kwargs),
                           reference_output(class_name, reference(**kwargs), kwargs))


@pytest.mark.parametrize("config_name", [TIED, UNTIED])
def test_make_stateful_restores_the_stock_layout(config_name: str) -> None:
    reference, converted = stateless_pair("T5ForConditionalGeneration", config_name)
    shared = converted.shared_embed_weight
    converted.make_stateful()
    assert list(converted.state_dict()) == list(reference.state_dict())
    assert converted.shared.weight is shared and converted.encoder.embed_tokens is converted.shared
    assert (converted.lm_head.weight is shared) == (config_name == TIED)
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "logits")
    converted.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(converted(**kwargs), reference(**kwargs).logits)


def test_stateless_model_loads_a_stock_checkpoint() -> None:
    reference, _ = pair("T5ForConditionalGeneration", TIED)
    torch.manual_seed(42)
    fresh = generated.T5ForConditionalGeneration(config(TIED)).make_stateless()
    fresh.load_state_dict(reference.state_dict(), strict=True)
    assert torch.equal(fresh.shared_embed_weight, reference.shared.weight)
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "logits")
    fresh.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(fresh(**kwargs), reference(**kwargs).logits)


def test_from_pretrained_then_make_stateless(tmp_path) -> None:
    reference, _ = pair("T5ForConditionalGeneration", UNTIED)
    reference.save_pretrained(tmp_path)
    loaded = generated.T5ForConditionalGeneration.from_pretrained(tmp_path).make_stateless()
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels")
    loaded.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(loaded(**kwargs), reference(**kwargs).loss)


# -- layouts other than T5's (toy modules in the shape of the families' own) ----------------------------------

class _Base(nn.Module):  # GPT-2's base model: holds the embedding it uses
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(11, 4)
        self.wpe = nn.Embedding(5, 4)


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = _Base()
        self.lm_head = nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


class _Stack(nn.Module):  # an encoder or decoder: only its embedding matters here
    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens


class _Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(11, 4)
        self.encoder = _Stack(self.shared)
        self.decoder = _Stack(self.shared)


class _Seq2Seq(nn.Module):  # BART's base model one level down: the holder is none of the users
    def __init__(self) -> None:
        super().__init__()
        self.model = _Shared()


def test_a_nested_holder_that_is_its_own_user_is_replaced_in_place() -> None:
    import stateless

    model = _Head()
    parameter = model.transformer.wte.weight
    stock_keys = list(model.state_dict())
    stateless.make_stateless(model, shared="transformer.wte", weight="shared_embed_weight",
                             users=("transformer.wte",), tied_linear="lm_head")
    assert [name for name, p in model.named_parameters() if p is parameter] == ["shared_embed_weight"]
    assert isinstance(model.transformer.wte, StatelessEmbedding) and isinstance(model.lm_head, StatelessLinear)
    assert list(own_children(model.transformer)) == ["wte", "wpe"]
    assert stateless.shared_weight(model, "transformer.wte", "shared_embed_weight") is parameter
    passed = torch.zeros(11, 4)
    assert stateless.shared_weight(model.transformer, "wte", "shared_embed_weight", passed) is passed
    with pytest.raises(ValueError, match="wte is stateless here"):
        stateless.shared_weight(model.transformer, "wte", "shared_embed_weight")
    state = stateless.stateful_state_dict(model)
    assert sorted(state) == sorted(stock_keys) and state["lm_head.weight"] is state["transformer.wte.weight"]
    fresh = _Head()
    stateless.make_stateless(fresh, shared="transformer.wte", weight="shared_embed_weight",
                             users=("transformer.wte",), tied_linear="lm_head")
    fresh.load_state_dict(_Head().state_dict() | {"transformer.wte.weight": parameter.detach(),
                                                  "lm_head.weight": parameter.detach()})
    assert torch.equal(fresh.shared_embed_weight, parameter)
    stateless.make_stateful(model)
    assert model.transformer.wte.weight is parameter and model.lm_head.weight is parameter
    assert list(model.state_dict()) == stock_keys and list(own_children(model.transformer)) == ["wte", "wpe"]


def test_a_nested_holder_that_no_user_is_goes_and_comes_back_in_its_place() -> None:
    import stateless

    model = _Seq2Seq()
    parameter = model.model.shared.weight
    stock_keys = list(model.state_dict())
    stateless.make_stateless(model, shared="model.shared", weight="shared_embed_weight",
                             users=("model.encoder.embed_tokens", "model.decoder.embed_tokens"))
    assert not hasattr(model.model, "shared")
    assert [name for name, p in model.named_parameters()] == ["shared_embed_weight"]
    assert sorted(stateless.stateful_state_dict(model)) == sorted(stock_keys)
    stateless.make_stateful(model)
    assert model.model.shared.weight is parameter and model.model.decoder.embed_tokens is model.model.shared
    assert list(own_children(model.model)) == ["shared", "encoder", "decoder"]
class _TiedByParameter(nn.Module):  # transformers 5.x: each stack owns an embedding, the weight is tied
    def __init__(self, padding_idx: int | None = None) -> None:
        super().__init__()
        self.shared = nn.Embedding(11, 4)
        self.encoder = _Stack(nn.Embedding(11, 4, padding_idx=padding_idx))
        self.encoder.embed_tokens.weight = self.shared.weight
        self.decoder = _Stack(nn.Embedding(11, 4))
        self.decoder.embed_tokens.weight = self.shared.weight


def test_users_that_tie_the_weight_in_embeddings_of_their_own_come_back_as_their_own() -> None:
    import stateless

    model = _TiedByParameter()
    parameter, stock_keys = model.shared.weight, list(model.state_dict())
    ids = torch.tensor([[1, 2, 10]])
    expected = model.encoder.embed_tokens(ids)
    users = ("encoder.embed_tokens", "decoder.embed_tokens")
    stateless.make_stateless(model, shared="shared", weight="shared_embed_weight", users=users)
    assert [name for name, _ in model.named_parameters()] == ["shared_embed_weight"]
    assert torch.equal(model.get_submodule("encoder.embed_tokens")(model.get_parameter("shared_embed_weight"), ids),
                       expected)
    assert sorted(stateless.stateful_state_dict(model)) == sorted(stock_keys)
    stateless.make_stateful(model)
    assert list(model.state_dict()) == stock_keys
    assert model.encoder.embed_tokens is not model.decoder.embed_tokens is not model.shared
    assert all(model.get_submodule(name).weight is parameter for name in ("shared", *users))


def test_a_user_neither_the_holder_nor_tying_its_weight_is_refused() -> None:
    import stateless

    users = ("encoder.embed_tokens", "decoder.embed_tokens")
    untied = _TiedByParameter()
    untied.decoder.embed_tokens = nn.Embedding(11, 4)
    with pytest.raises(ValueError, match="decoder.embed_tokens is not the shared embedding shared and does not tie"):
        stateless.make_stateless(untied, shared="shared", weight="w", users=users)
    with pytest.raises(ValueError, match="encoder.embed_tokens ties shared's weight but embeds with other settings"):
        stateless.make_stateless(_TiedByParameter(padding_idx=0), shared="shared", weight="w", users=users)


@pytest.mark.parametrize("copy_with", ["torch.save", "deepcopy"])
def test_a_stateless_model_pickles_and_keeps_loading_stock_keys(copy_with: str, tmp_path) -> None:
    # before: torch.save(model) failed with "Can't pickle local object '_load_hf_keys.<locals>.hook'"
    import copy
    reference, converted = stateless_pair("T5ForConditionalGeneration", TIED)
    if copy_with == "torch.save":
        torch.save(converted, tmp_path / "model.pt")
        restored = torch.load(tmp_path / "model.pt", weights_only=False)
    else:
        restored = copy.deepcopy(converted)
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "logits")
    restored.eval(), converted.eval(), reference.eval()
    with torch.no_grad():
        assert torch.equal(restored(**kwargs), converted(**kwargs))
    torch.manual_seed(7)
    other = stock.T5ForConditionalGeneration(config(TIED))
    restored.load_state_dict(other.state_dict(), strict=True)  # the HF-key hook survived the copy
    assert torch.equal(restored.shared_embed_weight, other.shared.weight)
    restored.make_stateful()
    assert not restored._load_state_dict_pre_hooks  # and make_stateful still removes it
    assert list(restored.state_dict()) == list(reference.state_dict())


@pytest.mark.parametrize("change", ["values", "shape"])
def test_a_checkpoint_whose_tied_copies_differ_is_refused(change: str) -> None:
    # Before: the stateless model loaded shared.weight and silently dropped a different encoder.embed_tokens.weight
    # (the stock model keeps the last of them, a mismatched shape fails there): a checkpoint of another model.
    _, converted = stateless_pair("T5ForConditionalGeneration", TIED)
    state = stock.T5ForConditionalGeneration(config(TIED)).state_dict()
    weight = state["encoder.embed_tokens.weight"]
    state["encoder.embed_tokens.weight"] = weight + 1 if change == "values" else weight[:-1]
    with pytest.raises(ValueError, match="shared.weight and encoder.embed_tokens.weight differ"):
        converted.load_state_dict(state)
    equal = stock.T5ForConditionalGeneration(config(TIED)).state_dict()
    converted.load_state_dict(equal)  # identical copies, as every stock checkpoint has them, still load
    assert torch.equal(converted.shared_embed_weight, equal["shared.weight"])
