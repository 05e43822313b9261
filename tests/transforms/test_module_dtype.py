"""The module_dtype transform (self.dtype -> stateless.module_dtype(self)) and its runtime helper."""

from __future__ import annotations

import torch
from support import ftpipe_standin
from support.transform_helpers import assert_rewrites, assert_unchanged
from torch import nn

from stateless import module_dtype
from transforms import REGISTRY
from transforms.module_dtype import ModuleDtype


def test_registered_under_its_module_name() -> None:
    assert REGISTRY["module_dtype"] is ModuleDtype


def test_own_dtype_reads_in_methods_become_helper_calls() -> None:
    assert_rewrites(ModuleDtype, """\
        class Model(PreTrainedModel):
            def forward(self, attention_mask):
                attention_mask = attention_mask.to(dtype=self.dtype)  # fp16 compatibility
                if self.dtype == torch.float16:
                    return attention_mask
                return (1.0 - attention_mask) * -10000.0
        """, """\
        from stateless import module_dtype

        class Model(PreTrainedModel):
            def forward(self, attention_mask):
                attention_mask = attention_mask.to(dtype=module_dtype(self))  # fp16 compatibility
                if module_dtype(self) == torch.float16:
                    return attention_mask
                return (1.0 - attention_mask) * -10000.0
        """)


def test_other_dtype_reads_are_a_no_op() -> None:
    assert_unchanged(ModuleDtype, """\
        def f(self, x):
            return x.to(self.dtype)


        class Model:
            @staticmethod
            def g(self):
                return self.dtype

            def h(self, x):
                self.dtype = x.dtype
                return lambda self: self.dtype
        """)


class _Owner(nn.Module):
    """A model holding a parameter itself, reading its dtype in forward (a stateless base model)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        self.inner = nn.Linear(3, 3)
        self.dtypes: list[object] = []

    @property
    def dtype(self) -> torch.dtype:  # ModuleUtilsMixin's: its first parameter's dtype
        return next(self.parameters()).dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dtypes.append(module_dtype(self))
        return x.to(dtype=module_dtype(self)) @ self.weight


def test_helper_is_the_dtype_property_eagerly_and_reads_the_first_parameter_under_ftpipe() -> None:
    model = _Owner()
    x = torch.randn(2, 3)
    assert module_dtype(model) is model.dtype is torch.float64
    graph = ftpipe_standin.trace(model, {"x": x})
    assert torch.equal(graph.run(x=x), model(x))
    # the property itself fails there: the tracer's wrapper of model.weight cannot be hashed
    model.forward = lambda x: x.to(dtype=model.dtype)  # type: ignore[method-assign]
    try:
        ftpipe_standin.trace(model, {"x": x})
    except NotImplementedError as error:
        assert "Parameter::__hash__" in str(error)
    else:
        raise AssertionError("the dtype property traced under wrapped parameters")
