"""stateless.fp16 against the transformers 4.5.1 code it replaces, and under torch's tracers."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stateless.fp16 import clamp_inf_fp16

# What generated modules do: fx patches this module's globals while tracing.
torch.fx.wrap("clamp_inf_fp16")

INF = math.inf
Tensor = torch.Tensor


def hf_clamp(hidden_states: Tensor) -> Tensor:
    """T5Block's guard, as transformers 4.5.1 writes it."""
    if hidden_states.dtype == torch.float16 and torch.isinf(hidden_states).any():
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
    return hidden_states


def hf_clamp_nan(hidden_states: Tensor) -> Tensor:
    """BartEncoderLayer's guard, as transformers 4.5.1 writes it: NaN also triggers the clamp."""
    if hidden_states.dtype == torch.float16 and (
        torch.isinf(hidden_states).any() or torch.isnan(hidden_states).any()
    ):
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
    return hidden_states


def value_and_grad(function: Callable[[Tensor], Tensor], values: Sequence[float],
                   dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``function``'s output and the gradient it sends back for a distinct upstream gradient per element."""
    leaf = torch.tensor(values, dtype=dtype, requires_grad=True)
    output = function(leaf)
    output.backward(torch.arange(1, len(values) + 1, dtype=output.dtype))
    assert leaf.grad is not None
    return output.detach(), leaf.grad


def assert_same(actual: tuple[Tensor, Tensor], expected: tuple[Tensor, Tensor]) -> None:
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # also checks dtypes


@pytest.mark.parametrize("values", [
    [1.0, INF, -2.0],
    [-INF, 65504.0, -65504.0, 64000.0],
    [math.nan, INF, 3.0],
], ids=["inf", "neg-inf-and-extremes", "nan-and-inf"])
def test_fp16_with_inf_is_clamped_like_hf(values: list[float]) -> None:
    expected = value_and_grad(hf_clamp, values, torch.float16)
    assert_same(value_and_grad(clamp_inf_fp16, values, torch.float16), expected)
    assert not expected[0].isinf().any()


def test_fp16_without_inf_keeps_values_beyond_the_bound() -> None:
    values = [65504.0, -65504.0, 1.0, math.nan]  # above finfo.max - 1000, yet untouched: no inf
    result = value_and_grad(clamp_inf_fp16, values, torch.float16)
    assert_same(result, value_and_grad(hf_clamp, values, torch.float16))
    assert result[0][0] == 65504.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_other_dtypes_pass_through_even_with_inf(dtype: torch.dtype) -> None:
    values = [INF, -1e30 if dtype != torch.float64 else -1e300, 2.0]
    assert_same(value_and_grad(clamp_inf_fp16, values, dtype), value_and_grad(hf_clamp, values, dtype))
    tensor = torch.tensor(values, dtype=dtype)
    assert clamp_inf_fp16(tensor) is tensor


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=16), min_size=1, max_size=6), st.sampled_from([torch.float16, torch.float32]))
def test_clamp_matches_hf_on_any_values(values: list[float], dtype: torch.dtype) -> None:
    assert_same(value_and_grad(clamp_inf_fp16, values, dtype), value_and_grad(hf_clamp, values, dtype))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(width=16), min_size=1, max_size=6), st.sampled_from([torch.float16, torch.float32]))
def test_nan_variant_matches_bart_on_any_values(values: list[float], dtype: torch.dtype) -> None:
    assert_same(value_and_grad(lambda x: clamp_inf_fp16(x, nan=True), values, dtype),
                value_and_grad(hf_clamp_nan, values, dtype))


def test_nan_variant_clamps_on_nan_alone() -> None:
    values = [65504.0, math.nan, 1.0]  # no inf: only the nan variant clamps the 65504
    assert clamp_inf_fp16(torch.tensor(values, dtype=torch.float16), nan=True)[0] < 65504.0
    assert_same(value_and_grad(lambda x: clamp_inf_fp16(x, nan=True), values, torch.float16),
                value_and_grad(hf_clamp_nan, values, torch.float16))


class Norm(torch.nn.Module):
    """The shape of rewritten T5 code: the helper called from a module's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, hidden_states: Tensor) -> Tensor:
        hidden_states = clamp_inf_fp16(hidden_states * 2)
        return self.weight * hidden_states


def test_symbolic_trace_records_the_helper_as_one_leaf() -> None:
    graph_module = torch.fx.symbolic_trace(Norm())
    calls = [node.target for node in graph_module.graph.nodes if node.op == "call_function"]
    assert calls.count(clamp_inf_fp16) == 1
    assert torch.isinf not in calls and torch.where not in calls  # not traced into


def test_symbolic_trace_keeps_runtime_behaviour() -> None:
    module = Norm().half()
    graph_module = torch.fx.symbolic_trace(module)
    for values in ([1.0, 2.0, 40000.0, 3.0], [1.0, INF, 40000.0, 3.0]):
        hidden = torch.tensor(values, dtype=torch.float16)
        assert torch.equal(graph_module(hidden), module(hidden))


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_export_follows_the_data_not_the_example(strict: bool, dtype: torch.dtype) -> None:
    module = Norm().to(dtype)
    # Exported on finite data: a baked-in branch would never clamp afterwards.
    program = torch.export.export(module, (torch.ones(4, dtype=dtype),), strict=strict)
    for values in ([1.0, 2.0, 40000.0, 3.0], [1.0, INF, 40000.0, 3.0]):
        hidden = torch.tensor(values, dtype=dtype)
        assert torch.equal(program.module()(hidden), module(hidden))
