from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import torch
from conftest import T5_SOURCE
from transform_helpers import assert_rewrites, assert_unchanged, run
from transforms.half_weight_cast import HalfWeightCast


def test_layer_norm_cast_becomes_a_helper_call() -> None:
    assert_rewrites(HalfWeightCast, """\
        import torch


        def forward(self, hidden_states):
            if self.weight.dtype == torch.float16:
                hidden_states = hidden_states.to(torch.float16)
            return self.weight * hidden_states
        """, """\
        import torch
        from stateless import cast_to_half_weight

        torch.fx.wrap("cast_to_half_weight")


        def forward(self, hidden_states):
            hidden_states = cast_to_half_weight(hidden_states, self.weight)
            return self.weight * hidden_states
        """)


def test_names_of_weight_and_tensor_are_free() -> None:
    assert_rewrites(HalfWeightCast, """\
        import torch
        def f(self, y):
            if self.norm.scale.dtype == torch.float16:
                y = y.to(torch.float16)
        """, """\
        import torch
        from stateless import cast_to_half_weight

        torch.fx.wrap("cast_to_half_weight")
        def f(self, y):
            y = cast_to_half_weight(y, self.norm.scale)
        """)


def test_half_spelled_through_aliases() -> None:
    assert_rewrites(HalfWeightCast, """\
        import torch as th
        from torch import half
        if self.weight.dtype == half: x = x.to(th.float16)
        """, """\
        import torch as th
        from torch import half
        import torch
        from stateless import cast_to_half_weight

        torch.fx.wrap("cast_to_half_weight")
        x = cast_to_half_weight(x, self.weight)
        """)


def test_module_option_names_the_import() -> None:
    # ``run`` takes ``module`` itself (the converted file's name): bind the option first.
    assert_rewrites(partial(HalfWeightCast, module="helpers.fp16"), """\
        import torch
        if self.weight.dtype == torch.half:
            x = x.to(torch.half)
        """, """\
        import torch
        from helpers.fp16 import cast_to_half_weight

        torch.fx.wrap("cast_to_half_weight")
        x = cast_to_half_weight(x, self.weight)
        """)


def test_comments_inside_the_statement_move_above_it() -> None:
    assert_rewrites(HalfWeightCast, """\
        import torch
        def f(self, x):
            # convert into float16 if necessary
            if self.weight.dtype == torch.float16:  # header
                # body
                x = x.to(torch.float16)  # trailing
            return x
        """, """\
        import torch
        from stateless import cast_to_half_weight

        torch.fx.wrap("cast_to_half_weight")
        def f(self, x):
            # convert into float16 if necessary
            # header
            # body
            # trailing
            x = cast_to_half_weight(x, self.weight)
            return x
        """)


def test_wrap_goes_after_the_last_top_level_import() -> None:
    assert_rewrites(HalfWeightCast, """\
        \"\"\"Doc.\"\"\"
        import torch
        X = 1
        from torch import nn
        def f(self, x):
            import math
            if self.weight.dtype == torch.float16:
                x = x.to(torch.float16)
        """, """\
        \"\"\"Doc.\"\"\"
        import torch
        from stateless import cast_to_half_weight

        X = 1
        from torch import nn

        torch.fx.wrap("cast_to_half_weight")
        def f(self, x):
            import math
            x = cast_to_half_weight(x, self.weight)
        """)


def test_wrap_joins_registrations_already_there_and_is_not_repeated() -> None:
    assert_rewrites(HalfWeightCast, """\
        import torch

        torch.fx.wrap("clamp_inf_fp16")
        torch.fx.wrap("cast_to_half_weight")
        if self.weight.dtype == torch.float16:
            x = x.to(torch.float16)
        """, """\
        import torch
        from stateless import cast_to_half_weight

        torch.fx.wrap("clamp_inf_fp16")
        torch.fx.wrap("cast_to_half_weight")
        x = cast_to_half_weight(x, self.weight)
        """)
    assert_rewrites(HalfWeightCast, """\
        import torch
        from torch import fx
        fx.wrap("other")
        if self.weight.dtype == torch.float16:
            x = x.to(torch.float16)
        """, """\
        import torch
        from torch import fx
        from stateless import cast_to_half_weight

        fx.wrap("other")
        torch.fx.wrap("cast_to_half_weight")
        x = cast_to_half_weight(x, self.weight)
        """)


def test_each_cast_is_rewritten_and_wrap_added_once() -> None:
    code = run(HalfWeightCast, """\
        import torch
        class A:
            def f(self, x):
                if self.a.dtype == torch.float16:
                    x = x.to(torch.float16)
                if self.b.dtype == torch.float16:
                    x = x.to(torch.float16)
                return x
        """)
    assert code.count("cast_to_half_weight(x, self.") == 2
    assert code.count('torch.fx.wrap("cast_to_half_weight")') == 1


@pytest.mark.parametrize("code", [
    pytest.param("import torch\nif self.weight.dtype == torch.bfloat16:\n    x = x.to(torch.bfloat16)\n",
                 id="another-dtype"),
    pytest.param("import torch\nif self.weight.dtype == torch.float16:\n    x = x.to(torch.float32)\n",
                 id="casts-to-another-dtype"),
    pytest.param("import torch\nif self.weight.dtype == torch.float16:\n    x = x.to(torch.float16)\n"
                 "else:\n    x = x.float()\n", id="else-branch"),
    pytest.param("import torch\nif a:\n    pass\nelif self.weight.dtype == torch.float16:\n"
                 "    x = x.to(torch.float16)\n", id="elif"),
    pytest.param("import torch\nif self.weight.dtype == torch.float16:\n    y = x.to(torch.float16)\n",
                 id="assigns-another-variable"),
    pytest.param("import torch\nif self.weight.dtype == torch.float16:\n    x = x.to(torch.float16)\n"
                 "    y = 1\n", id="more-statements"),
    pytest.param("import torch\nif self.weight.dtype != torch.float16:\n    x = x.to(torch.float16)\n",
                 id="not-equal"),
    pytest.param("import numpy as torch\nif self.weight.dtype == torch.float16:\n    x = x.to(torch.float16)\n",
                 id="not-torch"),
    pytest.param('import torch\nDOC = """if self.weight.dtype == torch.float16:\n    x = x.to(torch.float16)"""\n',
                 id="string"),
])
def test_anything_else_is_left_alone(code: str) -> None:
    assert_unchanged(HalfWeightCast, code)


@pytest.fixture(scope="module")
def converted_t5() -> str:
    return run(HalfWeightCast, T5_SOURCE.read_text())


def test_t5_layer_norm_is_the_only_change(converted_t5: str) -> None:
    source = T5_SOURCE.read_text()
    idiom = ("        if self.weight.dtype == torch.float16:\n"
             "            hidden_states = hidden_states.to(torch.float16)\n")
    last_import = "from .configuration_t5 import T5Config\n"
    assert source.count(idiom) == 1
    expected = source.replace(idiom, "        hidden_states = cast_to_half_weight(hidden_states, self.weight)\n")
    expected = expected.replace(last_import, last_import + "from stateless import cast_to_half_weight\n\n"
                                'torch.fx.wrap("cast_to_half_weight")\n')
    assert converted_t5 == expected
    compile(converted_t5, "modeling_t5.py", "exec")


def _class_code(source: str, name: str) -> str:
    start = source.index(f"\nclass {name}(")
    return source[start:source.index("\nclass ", start + 1)]


def _load(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "generated"}
    exec(compile(code, "<generated>", "exec"), namespace)
    return namespace


def test_converted_t5_layer_norm_traces_and_behaves_the_same(converted_t5: str) -> None:
    prelude = "import torch\nfrom torch import nn\n"
    original = _load(prelude + _class_code(T5_SOURCE.read_text(), "T5LayerNorm"))["T5LayerNorm"]
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(original(4))
    # The converted file's own import and registration, with the helper's real location.
    registration = [line for line in converted_t5.splitlines(keepends=True)
                    if line.startswith(("from stateless import", "torch.fx.wrap("))]
    assert len(registration) == 2
    converted = _load(prelude + "".join(registration).replace("from stateless import", "from stateless.fp16 import")
                      + _class_code(converted_t5, "T5LayerNorm"))["T5LayerNorm"]
    hidden = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    for dtype in (torch.float32, torch.float16):
        traced = torch.fx.symbolic_trace(converted(4).to(dtype))
        assert torch.equal(traced(hidden), original(4).to(dtype)(hidden))
        assert traced(hidden).dtype == dtype
