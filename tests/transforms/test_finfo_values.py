"""The finfo_values transform (torch.finfo(dtype).attr -> finfo_value) and its runtime helper."""

from __future__ import annotations

import pytest
import torch
from support.transform_helpers import assert_rewrites, assert_unchanged

from stateless.dtypes import finfo_value
from transforms.finfo_values import FinfoValues


def test_finfo_of_a_traced_dtype_becomes_a_leaf_call() -> None:
    assert_rewrites(FinfoValues, """\
        import torch


        def _expand_mask(mask, dtype):
            inverted_mask = 1.0 - mask
            return inverted_mask.masked_fill(inverted_mask.bool(), torch.finfo(dtype).min)


        def bound(x):
            return (torch.finfo(x.dtype).max) - 1000
        """, """\
        import torch
        from stateless import finfo_value

        torch.fx.wrap("finfo_value")


        def _expand_mask(mask, dtype):
            inverted_mask = 1.0 - mask
            return inverted_mask.masked_fill(inverted_mask.bool(), finfo_value(dtype, "min"))


        def bound(x):
            return (finfo_value(x.dtype, "max")) - 1000
        """)


def test_an_imported_alias_is_matched_by_qualified_name() -> None:
    assert_rewrites(FinfoValues, """\
        from torch import finfo


        def low(x):
            return finfo(x.dtype).min
        """, """\
        from torch import finfo
        import torch
        from stateless import finfo_value

        torch.fx.wrap("finfo_value")


        def low(x):
            return finfo_value(x.dtype, "min")
        """)


@pytest.mark.parametrize("code", [
    "import torch\n\n\ndef f():\n    return torch.finfo(torch.float16).max\n",  # a constant dtype: every tracer folds it
    "import torch\n\n\ndef f():\n    return torch.finfo().eps\n",  # the default dtype
    "import numpy as np\n\n\ndef f(x):\n    return np.finfo(x.dtype).min\n",  # not torch's
    "import torch\n\n\ndef f(x):\n    return torch.finfo(x.dtype)\n",  # no attribute read
])
def test_other_code_is_left_alone(code: str) -> None:
    assert_unchanged(FinfoValues, code)


class _DtypeStandIn:
    """What a tracer that wraps values (FTPipe's) passes for a dtype: equal to the dtype it stands for."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __eq__(self, other: object) -> bool:
        return other == self.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_helper_gives_finfo_for_dtypes_and_stand_ins(dtype: torch.dtype) -> None:
    for name in ("min", "max", "eps"):
        assert finfo_value(dtype, name) == getattr(torch.finfo(dtype), name)
        assert finfo_value(_DtypeStandIn(dtype), name) == getattr(torch.finfo(dtype), name)


def test_fx_records_the_helper_and_reads_the_dtype_when_the_graph_runs() -> None:
    namespace: dict = {}
    exec(compile("import torch\nfrom stateless import finfo_value\ntorch.fx.wrap('finfo_value')\n\n"
                 "def low(x):\n    return x.new_zeros(()) + finfo_value(x.dtype, 'min')\n", "<low>", "exec"), namespace)
    with pytest.raises(TypeError):  # what the stock code meets under symbolic_trace
        torch.fx.symbolic_trace(lambda x: x.new_zeros(()) + torch.finfo(x.dtype).min)
    graph = torch.fx.symbolic_trace(namespace["low"])
    assert any(node.target is finfo_value for node in graph.graph.nodes)
    assert graph(torch.ones(2, dtype=torch.float16)).item() == torch.finfo(torch.float16).min
    assert graph(torch.ones(2)).item() == torch.finfo(torch.float32).min
