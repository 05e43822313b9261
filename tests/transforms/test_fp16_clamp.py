from __future__ import annotations

import math
import operator
from functools import partial
from textwrap import dedent
from textwrap import indent as indent_code
from typing import Any

import pytest
import torch
from conftest import T5_SOURCE
from support import transform_helpers
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from stateless.fp16 import clamp_inf_fp16
from transforms.fp16_clamp import Fp16Clamp

T5_CLAMP = """\
    # clamp inf values to enable fp16 training
    if hidden_states.dtype == torch.float16 and torch.isinf(hidden_states).any():
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
"""


warnings_of = partial(transform_helpers.warnings_of, Fp16Clamp)


def test_hf_clamp_becomes_a_helper_call_keeping_its_comment() -> None:
    assert_rewrites(Fp16Clamp, "import torch\n\n\ndef forward(hidden_states):\n" + T5_CLAMP
                    + "    return hidden_states\n", """\
        import torch
        from stateless import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")


        def forward(hidden_states):
            # clamp inf values to enable fp16 training
            hidden_states = clamp_inf_fp16(hidden_states)
            return hidden_states
        """)


def test_bart_guard_with_nan_passes_nan_true() -> None:
    assert_rewrites(Fp16Clamp, """\
        import torch


        def forward(hidden_states):
            if hidden_states.dtype == torch.float16 and (
                torch.isinf(hidden_states).any() or torch.isnan(hidden_states).any()
            ):
                clamp_value = torch.finfo(hidden_states.dtype).max - 1000
                hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
            return hidden_states
        """, """\
        import torch
        from stateless import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")


        def forward(hidden_states):
            hidden_states = clamp_inf_fp16(hidden_states, nan=True)
            return hidden_states
        """)


BART5_CLAMP = """\
    if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():
        clamp_value = torch.finfo(hidden_states.dtype).max - 1000
        hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
"""


def test_bart5_not_isfinite_guard_passes_nan_true() -> None:
    before = "import torch\n\n\ndef forward(hidden_states):\n" + BART5_CLAMP + "    return hidden_states\n"
    after = """\
        import torch
        from stateless import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")


        def forward(hidden_states):
            hidden_states = clamp_inf_fp16(hidden_states, nan=True)
            return hidden_states
        """
    assert_rewrites(Fp16Clamp, before, after)
    assert_unchanged(Fp16Clamp, dedent(after))  # idempotent


def test_isfinite_without_not_is_left_alone() -> None:
    assert_unchanged(Fp16Clamp, "import torch\n\n\ndef forward(hidden_states):\n"
                     + BART5_CLAMP.replace("not torch.isfinite", "torch.isfinite") + "    return hidden_states\n")


@pytest.mark.parametrize("bounds", [
    "-c, c",
    "-c, max=c",
    "min=-c, max=c",
    "max=c, min=-c",
])
def test_clamp_bounds_positional_or_keyword(bounds: str) -> None:
    assert_rewrites(Fp16Clamp, f"""\
        import torch
        def f(h):
            if h.dtype == torch.float16 and torch.isinf(h).any():
                c = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, {bounds})
        """, """\
        import torch
        from stateless import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")
        def f(h):
            h = clamp_inf_fp16(h)
        """)


def test_torch_names_through_aliases() -> None:
    assert_rewrites(Fp16Clamp, """\
        import torch as th
        from torch import clamp, half, isinf
        def f(h):
            if h.dtype == half and isinf(h).any():
                c = th.finfo(h.dtype).max - 1000
                h = clamp(h, min=-c, max=c)
        """, """\
        import torch as th
        from torch import clamp, half, isinf
        import torch
        from stateless import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")
        def f(h):
            h = clamp_inf_fp16(h)
        """)


def test_module_option_names_the_import() -> None:
    # ``run`` takes ``module`` itself (the converted file's name): bind the option first.
    assert_rewrites(partial(Fp16Clamp, module="helpers.fp16"),  # type: ignore[arg-type]
                    "import torch\ndef f(hidden_states):\n" + T5_CLAMP, """\
        import torch
        from helpers.fp16 import clamp_inf_fp16

        torch.fx.wrap("clamp_inf_fp16")
        def f(hidden_states):
            # clamp inf values to enable fp16 training
            hidden_states = clamp_inf_fp16(hidden_states)
        """)


def test_every_clamp_sharing_the_bound_name_is_rewritten_with_one_wrap() -> None:
    code = run(Fp16Clamp, "import torch\nimport math\ndef f(hidden_states, layer):\n" + T5_CLAMP
               + "    hidden_states = layer(hidden_states)\n" + T5_CLAMP + "    return hidden_states\n")
    assert code.count("    hidden_states = clamp_inf_fp16(hidden_states)\n") == 2
    assert "clamp_value" not in code and "isinf" not in code
    assert code.startswith('import torch\nimport math\nfrom stateless import clamp_inf_fp16\n\n'
                           'torch.fx.wrap("clamp_inf_fp16")\n')


def test_wrap_is_not_added_twice() -> None:
    assert_rewrites(Fp16Clamp, """\
        import torch
        from torch import fx
        fx.wrap("clamp_inf_fp16")
        def f(h):
            if h.dtype == torch.float16 and torch.isinf(h).any():
                c = torch.finfo(h.dtype).max - 1000
                h = torch.clamp(h, -c, c)
        """, """\
        import torch
        from torch import fx
        from stateless import clamp_inf_fp16

        fx.wrap("clamp_inf_fp16")
        def f(h):
            h = clamp_inf_fp16(h)
        """)


@pytest.mark.parametrize("later_read", [
    "    return hidden_states, clamp_value\n",
    "    return lambda: clamp_value\n",
    "    for _ in range(2):\n        print(clamp_value)\n",
], ids=["after", "in-a-closure", "in-a-loop"])
def test_bound_read_outside_the_block_is_kept_with_a_warning(later_read: str) -> None:
    code = "import torch\ndef f(hidden_states):\n" + T5_CLAMP + later_read
    assert_unchanged(Fp16Clamp, code)
    assert warnings_of(code) == ["fp16 clamp of 'hidden_states' kept: 'clamp_value' is read outside the block"]


CLAMP_VARIANTS = {
    "another-dtype": T5_CLAMP.replace("torch.float16", "torch.bfloat16"),
    "another-variable-clamped": T5_CLAMP.replace("torch.clamp(hidden_states,", "torch.clamp(other,"),
    "another-variable-checked": T5_CLAMP.replace("torch.isinf(hidden_states)", "torch.isinf(other)"),
    "another-variable-assigned": T5_CLAMP.replace("        hidden_states = torch", "        other = torch"),
    "another-margin": T5_CLAMP.replace("- 1000", "- 100"),
    "bounds-swapped": T5_CLAMP.replace("min=-clamp_value, max=clamp_value", "min=clamp_value, max=-clamp_value"),
    "other-bound-name": T5_CLAMP.replace("max=clamp_value)", "max=other)"),
    "or-instead-of-and": T5_CLAMP.replace(" and ", " or "),
    "not-any": T5_CLAMP.replace(".any()", ".all()"),
    "else-branch": T5_CLAMP + "    else:\n        pass\n",
    "extra-statement": T5_CLAMP + "        print(hidden_states)\n",
    "not-torch": T5_CLAMP.replace("torch.clamp", "numpy.clip"),
}


@pytest.mark.parametrize("variant", CLAMP_VARIANTS.values(), ids=CLAMP_VARIANTS.keys())
def test_anything_else_is_left_alone(variant: str) -> None:
    assert_unchanged(Fp16Clamp, "import torch\nimport numpy\ndef f(hidden_states, other):\n" + variant)


def test_strings_and_comments_are_left_alone() -> None:
    assert_unchanged(Fp16Clamp, 'import torch\nDOC = """\n' + T5_CLAMP + '"""\n'
                     + "".join(f"# {line}\n" for line in T5_CLAMP.splitlines()))


@pytest.fixture(scope="module")
def converted_t5() -> str:
    return run(Fp16Clamp, T5_SOURCE.read_text())


def test_t5_block_clamps_are_the_only_change(converted_t5: str) -> None:
    expected = T5_SOURCE.read_text()
    for indent in ("        ", "            "):  # T5Block.forward, and its cross-attention branch
        expected = expected.replace(indent_code(dedent(T5_CLAMP), indent), indent_code(
            "# clamp inf values to enable fp16 training\nhidden_states = clamp_inf_fp16(hidden_states)\n", indent))
    last_import = "from .configuration_t5 import T5Config\n"
    expected = expected.replace(last_import, last_import + "from stateless import clamp_inf_fp16\n\n"
                                'torch.fx.wrap("clamp_inf_fp16")\n')
    assert converted_t5 == expected
    assert converted_t5.count("hidden_states = clamp_inf_fp16(hidden_states)") == 3
    compile(converted_t5, "modeling_t5.py", "exec")


def _class_code(source: str, name: str) -> str:
    start = source.index(f"\nclass {name}(")
    return source[start:source.index("\nclass ", start + 1)]


def test_no_isinf_is_left_in_t5_block(converted_t5: str) -> None:
    assert _class_code(T5_SOURCE.read_text(), "T5Block").count("torch.isinf") == 3
    assert "torch.isinf" not in _class_code(converted_t5, "T5Block")


def _load(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "generated"}
    exec(compile(code, "<generated>", "exec"), namespace)
    return namespace


BLOCK = """\
import torch


class Block(torch.nn.Module):
    def forward(self, hidden_states):
        hidden_states = hidden_states * 2
""" + indent_code(T5_CLAMP, "    ") + """\
        return hidden_states
"""


def test_generated_code_traces_and_clamps_on_data() -> None:
    # torch.export of the helper is covered in test_fp16_helpers.
    original = _load(BLOCK)["Block"]()
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(original)
    converted = _load(run(partial(Fp16Clamp, module="stateless.fp16"), BLOCK))["Block"]()  # type: ignore[arg-type]
    traced = torch.fx.symbolic_trace(converted)
    assert [node.target for node in traced.graph.nodes if node.op == "call_function"] == [operator.mul, clamp_inf_fp16]
    for values in ([1.0, 30000.0], [1.0, 40000.0], [-math.inf, 1.0]):  # doubling 40000 overflows float16
        hidden = torch.tensor(values, dtype=torch.float16)
        assert torch.equal(traced(hidden), original(hidden))
    assert original(torch.tensor([1.0, 40000.0], dtype=torch.float16)).isfinite().all()
