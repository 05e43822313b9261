from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import T5_SOURCE
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.size_varargs import SizeVarargs


def test_two_sizes_become_one_tuple() -> None:
    assert_rewrites(SizeVarargs, "import torch\nm = torch.ones(a, b)\n",
                    "import torch\nm = torch.ones((a, b))\n")


def test_keywords_stay_after_the_tuple() -> None:
    assert_rewrites(SizeVarargs, "import torch\nm = torch.zeros(a, b, c, device=d, dtype=torch.long)\n",
                    "import torch\nm = torch.zeros((a, b, c), device=d, dtype=torch.long)\n")


def test_every_default_factory() -> None:
    before = "".join(f"import torch\nx = torch.{f}(a, b)\n" for f in ("ones", "zeros", "empty", "rand", "randn"))
    assert_rewrites(SizeVarargs, before, before.replace("(a, b)", "((a, b))"))


def test_aliases_resolve_by_qualified_name() -> None:
    assert_rewrites(SizeVarargs, """\
        import torch as th
        from torch import zeros as z
        x = th.ones(a, b)
        y = z(a, b)
        """, """\
        import torch as th
        from torch import zeros as z
        x = th.ones((a, b))
        y = z((a, b))
        """)


def test_multiline_call_keeps_its_layout() -> None:
    assert_rewrites(SizeVarargs, """\
        import torch
        mask = torch.ones(
            batch,  # rows
            length, device=d,
        )
        """, """\
        import torch
        mask = torch.ones(
            (batch,  # rows
            length), device=d,
        )
        """)


def test_nested_factory_calls_are_both_rewritten() -> None:
    assert_rewrites(SizeVarargs, "import torch\nx = torch.ones(torch.zeros(a, b).size(0), n)\n",
                    "import torch\nx = torch.ones((torch.zeros((a, b)).size(0), n))\n")


def test_functions_option_replaces_the_list() -> None:
    code = "import torch\nx = torch.ones(a, b)\ny = torch.empty(a, b)\n"
    assert_rewrites(SizeVarargs, code, "import torch\nx = torch.ones(a, b)\ny = torch.empty((a, b))\n",
                    functions=["torch.empty"])


@pytest.mark.parametrize("code", [
    "import torch\nx = torch.ones((a, b), device=d)\n",
    "import torch\nx = torch.ones([a, b])\n",
    "import torch\nx = torch.ones(a, device=d)\n",
    "import torch\nx = torch.ones(*shape)\n",
    "import torch\nx = torch.ones(a, *rest)\n",
    "import torch\nx = torch.full(a, b)\n",
    "x = y.new_ones(a, b)\nz = y.new_zeros(a, b)\n",
    "def ones(a, b): ...\nx = ones(a, b)\n",
    "import numpy as np\nx = np.ones(a, b)\n",
    'import torch\nDOC = "torch.ones(a, b)"  # torch.ones(a, b)\n',
])
def test_left_alone(code: str) -> None:
    assert_unchanged(SizeVarargs, code)


def test_rewritten_call_traces_with_fx() -> None:
    code = "import torch\ndef f(x):\n    return torch.ones(x.shape[0], x.shape[1], dtype=x.dtype) + x\n"

    def traced(source: str) -> torch.fx.GraphModule:
        namespace: dict = {}
        exec(source, namespace)
        return torch.fx.symbolic_trace(namespace["f"])

    with pytest.raises(TypeError):
        traced(code)
    x = torch.randn(2, 3)
    assert torch.equal(traced(run(SizeVarargs, code))(x), x + 1)


def test_t5_source() -> None:
    source = T5_SOURCE.read_text()
    result = run(SizeVarargs, source)
    compile(result, "modeling_t5.py", "exec")
    before, after = source.splitlines(), result.splitlines()
    assert len(before) == len(after)
    assert [(old.strip(), new.strip()) for old, new in zip(before, after) if old != new] == [
        ("attention_mask = torch.ones(batch_size, mask_seq_length).to(inputs_embeds.device)",
         "attention_mask = torch.ones((batch_size, mask_seq_length)).to(inputs_embeds.device)"),
        ("batch_size, encoder_seq_length, device=inputs_embeds.device, dtype=torch.long",
         "(batch_size, encoder_seq_length), device=inputs_embeds.device, dtype=torch.long"),
    ]


def test_a_size_unpacked_into_a_listed_method_is_passed_whole() -> None:
    assert_rewrites(SizeVarargs, """\
        def merge_heads(x):
            new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)
            return x.view(*new_x_shape).reshape(*shape)
        """, """\
        def merge_heads(x):
            new_x_shape = x.size()[:-2] + (x.size(-2) * x.size(-1),)
            return x.view(new_x_shape).reshape(*shape)
        """, methods=["view"])


def test_methods_other_spellings_are_left_alone() -> None:
    assert_unchanged(SizeVarargs, """\
        x = x.view(*shape, -1)
        y = x.view(shape)
        z = x.view(-1, *shape)
        w = x.view(**kwargs)
        v = view(*shape)
        """, methods=["view"])
    assert_unchanged(SizeVarargs, "x = x.view(*shape)\n")  # no methods listed: none rewritten


def test_a_star_unpacked_shape_is_concatenated() -> None:
    assert_rewrites(SizeVarargs, """\
        def attention(self, hidden_states, states, out):
            input_shape = hidden_states.shape[:-1]
            hidden_shape = (*input_shape, -1, self.d)
            kv_shape = (*states.size()[:-1], -1, self.d)
            first = (*input_shape, 3)[0]
            out = out.reshape(*input_shape, -1)
            return out.view(1, *states.shape, 2, 3)
        """, """\
        def attention(self, hidden_states, states, out):
            input_shape = hidden_states.shape[:-1]
            hidden_shape = input_shape + (-1, self.d)
            kv_shape = states.size()[:-1] + (-1, self.d)
            first = (input_shape + (3,))[0]
            out = out.reshape(input_shape + (-1,))
            return out.view((1,) + states.shape + (2, 3))
        """, methods=["view", "reshape"])


@pytest.mark.parametrize("code", [
    "def f(x, s):\n    return (*s, 1)\n",                                        # not known to be a shape
    "def f(x):\n    s = x.shape\n    s = [1]\n    return (*s, 1)\n",           # bound twice
    "def f(x):\n    return (*x.shape[0], 1)\n",                                 # an index, not a slice
    "def f(x):\n    return (*x.size(0), 1)\n",                                  # a size, not the shape
    "def f(x):\n    return x.reshape(*x.shape, -1)\n",                          # reshape not listed
    "def f(x):\n    return (x.shape, 1)\n",                                     # nothing unpacked
])
def test_what_may_not_be_a_shape_is_left_alone(code: str) -> None:
    assert_unchanged(SizeVarargs, code, methods=["view"])


def test_concatenated_shapes_trace_with_fx_and_export() -> None:
    code = ("import torch\ndef f(x):\n    input_shape = x.shape[:-1]\n"
            "    return x.view(*input_shape, 2, -1).reshape(*input_shape, -1) * 2\n")

    def build(source: str) -> Callable[..., Any]:
        namespace: dict = {}
        exec(source, namespace)
        return namespace["f"]

    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(build(code))
    rewritten = build(run(SizeVarargs, code, methods=["view", "reshape"]))
    traced = torch.fx.symbolic_trace(rewritten)
    for shape in ((2, 3, 4), (5, 6)):
        x = torch.randn(*shape)
        assert torch.equal(traced(x), x * 2) and torch.equal(build(code)(x), x * 2)
    module = type("M", (torch.nn.Module,), {"forward": lambda self, x: rewritten(x)})()
    batch = torch.export.Dim("batch", min=2)
    program = torch.export.export(module, (torch.randn(3, 5, 4),), dynamic_shapes=({0: batch},))
    x = torch.randn(7, 5, 4)
    assert torch.equal(program.module()(x), x * 2)
