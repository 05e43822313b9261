"""Every generated class of each family traces with torch.fx and torch.export, and the traces compute what eager does.

Family-generic: the families are tests/model_families.py's GENERIC list (T5 has test_t5_tracing.py).
"""

from __future__ import annotations

import pytest
import torch
from support.model_checks import Family, assert_clean_graph, assert_train_trace_follows_mode, dropout_nodes, fx_trace
from support.model_families import GENERIC
from torch.export import Dim

# Traced on the richest config (cross-attention where the family has it) and a plain one.
CASES = [(family, config_name, class_name, path) for family in GENERIC
         for config_name in (family.configs[1], family.configs[-1]) for class_name, path in family.cases()]
IDS = [f"{f.name}-{c}-{cls}-{p}" for f, c, cls, p in CASES]


def model(family: Family, class_name: str, config_name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return getattr(family.generated, class_name)(family.make_config(config_name))


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_stock_model_does_not_trace_with_fx(family: Family) -> None:
    """The baseline the converter fixes: otherwise the tests below would prove nothing."""
    for class_name, path in family.cases():
        torch.manual_seed(0)
        stock_model = getattr(family.stock, class_name)(family.make_config(family.configs[0])).eval()
        kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=family.configs[0]), path)
        # Control flow on a traced value, or (BART) a Proxy where a tensor is needed: item assignment, finfo.
        with pytest.raises((torch.fx.proxy.TraceError, TypeError)):
            fx_trace(stock_model, kwargs)


@pytest.mark.parametrize("masks", [True, False], ids=["masks", "no-masks"])
@pytest.mark.parametrize("family,config_name,class_name,path", CASES, ids=IDS)
def test_fx_symbolic_trace_matches_eager(family: Family, config_name: str, class_name: str, path: str,
                                         masks: bool) -> None:
    module = model(family, class_name, config_name).eval()
    kwargs = family.call_kwargs(class_name, family.make_inputs(masks, config_name=config_name), path)
    graph_module = fx_trace(module, kwargs)
    assert_clean_graph(graph_module.graph)
    with torch.no_grad():
        assert torch.equal(graph_module(**kwargs), module(**kwargs))
        other = family.call_kwargs(class_name, family.make_inputs(masks, batch=3, seed=5, config_name=config_name,
                                                                  **family.lengths), path)
        assert torch.equal(graph_module(**other), module(**other))


@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_fx_trace_taken_in_train_mode_follows_eval_and_train(family: Family) -> None:
    class_name = family.model_family.definition.default_class
    config_name = family.configs[-1]
    module = model(family, class_name, config_name)
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name),
                                family.paths[class_name][0])
    assert dropout_nodes(fx_trace(module.train(), kwargs)) > 3
    assert_train_trace_follows_mode(module, kwargs)


def dynamic_shapes(family: Family, kwargs: dict) -> dict:
    """Batch and every sequence length dynamic, over what the family's configs allow."""
    batch = Dim("batch", min=2, max=64)
    # >= 3: a shifted loss slices [..., :-1], and export's 0/1 specialization would demand length - 1 != 1.
    lengths = {name: Dim(name, min=3, max=30) for name in family.model_family.definition.lengths}
    shapes = {spec.name: spec.shape for spec in family.model_family.definition.inputs}
    result = {}
    for name, value in kwargs.items():
        shape = shapes.get(name)
        if shape is None:  # an input the recipe's training batch lacks: its leading dims are batch and sequence
            shape = ("batch", next(iter(lengths)))
        result[name] = {i: batch if dim == "batch" else lengths[dim] for i, dim in enumerate(shape)
                        if i < value.dim() and isinstance(dim, str)}
    return result


# Each class and path is exported once, strict and non-strict alternating along a family's cases, so both modes
# run for every family: exporting is most of this file's time. scripts/release_table.py exports every case both
# ways (its 4.5.1 rows).
EXPORT_CASES = [(family, class_name, path, index % 2 == 0) for family in GENERIC
                for index, (class_name, path) in enumerate(family.cases())]


@pytest.mark.parametrize("family,class_name,path,strict", EXPORT_CASES,
                         ids=[f"{f.name}-{c}-{p}-{'strict' if s else 'non-strict'}" for f, c, p, s in EXPORT_CASES])
def test_torch_export_with_dynamic_batch_and_sequence(family: Family, class_name: str, path: str,
                                                      strict: bool) -> None:
    assert {s for f, _, _, s in EXPORT_CASES if f is family} == {True, False}, f"{family.name}: one mode only"
    config_name = family.configs[1]
    module = model(family, class_name, config_name).eval()
    kwargs = family.call_kwargs(class_name, family.make_inputs(True, config_name=config_name), path)
    program = torch.export.export(module, (), kwargs, dynamic_shapes=dynamic_shapes(family, kwargs), strict=strict)
    exported = program.module()
    with torch.no_grad():
        assert torch.equal(exported(**kwargs), module(**kwargs))
        other = family.call_kwargs(class_name, family.make_inputs(True, batch=5, seed=9, config_name=config_name,
                                                                  **family.lengths), path)
        assert torch.equal(exported(**other), module(**other))
