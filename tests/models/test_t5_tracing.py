"""Every generated T5 class traces with torch.fx and torch.export, and the traces compute what eager does."""

from __future__ import annotations

import pytest
import torch
from support.model_checks import assert_clean_graph, fx_trace
from support.t5_models import CLASSES, call_kwargs, config, generated, inputs, stock
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

CONFIG = "2layer-gelu-untied"
PATH = {"T5ForConditionalGeneration": "labels", "T5Model": "hidden", "T5EncoderModel": "hidden"}


def model(class_name: str, config_name: str = CONFIG) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(generated, class_name)(config(config_name))


@pytest.mark.parametrize("class_name", CLASSES)
def test_stock_model_does_not_trace_with_fx(class_name: str) -> None:
    """The baseline the converter fixes: otherwise the tests below would prove nothing."""
    torch.manual_seed(0)
    stock_model = getattr(stock, class_name)(config(CONFIG)).eval()
    kwargs = call_kwargs(class_name, inputs(True), PATH[class_name])
    with pytest.raises(torch.fx.proxy.TraceError):
        fx_trace(stock_model, kwargs)


FX_CASES = [("T5ForConditionalGeneration", path) for path in ("labels", "labels-only", "logits")]
FX_CASES += [("T5Model", "hidden"), ("T5EncoderModel", "hidden")]


@pytest.mark.parametrize("class_name,path", FX_CASES)
@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
def test_fx_symbolic_trace_matches_eager(class_name: str, path: str, masks: bool) -> None:
    module = model(class_name).eval()
    kwargs = call_kwargs(class_name, inputs(masks), path)
    graph_module = fx_trace(module, kwargs)
    assert_clean_graph(graph_module.graph)
    with torch.no_grad():
        assert torch.equal(graph_module(**kwargs), module(**kwargs))
        other = call_kwargs(class_name, inputs(masks, batch=3, source=9, target=4, seed=5), path)
        assert torch.equal(graph_module(**other), module(**other))


def test_fx_trace_taken_in_train_mode_follows_eval_and_train() -> None:
    class_name = "T5ForConditionalGeneration"
    module = model(class_name).train()
    kwargs = call_kwargs(class_name, inputs(True), "labels")
    graph_module = fx_trace(module, kwargs)
    dropouts = [n for n in graph_module.graph.nodes
                if n.op == "call_module" and isinstance(graph_module.get_submodule(n.target), torch.nn.Dropout)]
    assert len(dropouts) > 5  # attention, residual, embedding and final dropouts are all modules

    graph_module.eval(), module.eval()
    with torch.no_grad():
        first, second = graph_module(**kwargs), graph_module(**kwargs)
        assert torch.equal(first, second), "gm.eval() left a dropout active"
        assert torch.equal(first, module(**kwargs))

    graph_module.train(), module.train()
    torch.manual_seed(7)
    traced_train = graph_module(**kwargs)
    torch.manual_seed(7)
    eager_train = module(**kwargs)
    assert torch.equal(traced_train, eager_train)
    assert not torch.equal(traced_train, first), "gm.train() did not turn dropout back on"


def dynamic_shapes(kwargs: dict) -> dict:
    # target >= 3: shift-right slices labels[..., :-1], and export's 0/1 specialization
    # would otherwise demand target - 1 != 1.
    batch, source, target = Dim("batch", min=2, max=64), Dim("source", min=2, max=512), Dim("target", min=3, max=512)
    dims = {"input_ids": (batch, source), "attention_mask": (batch, source),
            "decoder_input_ids": (batch, target), "decoder_attention_mask": (batch, target),
            "labels": (batch, target)}
    return {name: {0: dims[name][0], 1: dims[name][1]} for name in kwargs}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
@pytest.mark.parametrize("class_name", CLASSES)
def test_torch_export_with_dynamic_batch_and_sequence(class_name: str, strict: bool) -> None:
    module = model(class_name).eval()
    path = "labels-only" if class_name == "T5ForConditionalGeneration" else "hidden"
    kwargs = call_kwargs(class_name, inputs(True), path)
    program = torch.export.export(module, (), kwargs, dynamic_shapes=dynamic_shapes(kwargs), strict=strict)
    exported = program.module()
    with torch.no_grad():
        assert torch.equal(exported(**kwargs), module(**kwargs))
        other = call_kwargs(class_name, inputs(True, batch=5, source=11, target=4, seed=9), path)
        assert torch.equal(exported(**other), module(**other))


def test_stock_model_does_not_export_with_labels_only() -> None:
    torch.manual_seed(0)
    stock_model = stock.T5ForConditionalGeneration(config(CONFIG)).eval()
    kwargs = call_kwargs("T5ForConditionalGeneration", inputs(True), "labels-only")
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(stock_model, (), dict(kwargs, return_dict=False), strict=False)


def test_guards_reject_what_the_specialization_assumed_away() -> None:
    module = model("T5EncoderModel").eval()
    kwargs = call_kwargs("T5EncoderModel", inputs(True), "hidden")
    three_d = kwargs["attention_mask"][:, None, :].expand(-1, kwargs["input_ids"].shape[1], -1)
    with pytest.raises(Exception, match=r"attention_mask must be \(batch, seq_len\)"):
        module(input_ids=kwargs["input_ids"], attention_mask=three_d)
