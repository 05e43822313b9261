"""drop_forwarded_kwargs: ``**kwargs`` parameters that are only passed on go, with the ``**kwargs`` arguments."""

from __future__ import annotations

import re
from functools import partial

import libcst as cst
import pytest
from conftest import REPO, T5_MEMBER
from libcst.codemod import CodemodContext
from support import transform_helpers
from support.transform_helpers import MODULE, assert_rewrites, assert_unchanged

from common.schema import OptionError, parse_options
from transforms import REGISTRY
from transforms.drop_forwarded_kwargs import DropForwardedKwargs, ForwardedKwargsOptions

KWARGS_ANNOTATIONS = ("transformers.utils.TransformersKwargs",)


warnings_of = partial(transform_helpers.warnings_of, DropForwardedKwargs)
assert_kept = partial(transform_helpers.assert_left_with_warning, DropForwardedKwargs)


def test_registered() -> None:
    assert REGISTRY["drop_forwarded_kwargs"] is DropForwardedKwargs


# --- rewrites ---------------------------------------------------------------------------------------------

def test_forwarding_methods_and_the_attention_function_lose_kwargs_and_their_imports() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        from torch import nn
        from ...processing_utils import Unpack
        from ...utils import TransformersKwargs, logging

        def eager_attention_forward(module, query, key, dropout: float = 0.0, **kwargs: Unpack[TransformersKwargs]):
            return query @ key

        class Attention(nn.Module):
            def forward(
                self,
                hidden_states,
                mask=None,
                **kwargs: Unpack[TransformersKwargs],
            ):
                return eager_attention_forward(self, hidden_states, hidden_states, **kwargs)

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.attention = Attention()

            def forward(self, hidden_states, mask=None, **kwargs: Unpack[TransformersKwargs]):
                return self.attention(
                    hidden_states,
                    mask=mask,
                    **kwargs,
                )
        """, """\
        from torch import nn
        from ...utils import logging

        def eager_attention_forward(module, query, key, dropout: float = 0.0):
            return query @ key

        class Attention(nn.Module):
            def forward(
                self,
                hidden_states,
                mask=None,
            ):
                return eager_attention_forward(self, hidden_states, hidden_states)

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.attention = Attention()

            def forward(self, hidden_states, mask=None):
                return self.attention(
                    hidden_states,
                    mask=mask,
                )
        """)
    assert warnings_of("def f(x, **kwargs):\n    return g(x, **kwargs)\n") == []


def test_an_import_the_rest_of_the_module_still_uses_stays() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        from transformers.processing_utils import Unpack
        from transformers.utils import TransformersKwargs

        def f(x, **kwargs: Unpack[TransformersKwargs]):
            return g(x, **kwargs)

        def h(options: TransformersKwargs):
            return options
        """, """\
        from transformers.utils import TransformersKwargs

        def f(x):
            return g(x)

        def h(options: TransformersKwargs):
            return options
        """)


def test_a_dotted_annotation_removes_its_module_import() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        import torch
        import typing_extensions
        from transformers.utils import Unpack

        def f(x: Unpack, **kwargs: typing_extensions.Unpack[dict]):
            return g(x, **kwargs)
        """, """\
        import torch
        from transformers.utils import Unpack

        def f(x: Unpack):
            return g(x)
        """)


def test_unused_kwargs_and_every_parameter_layout() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        def a(**kwargs):
            pass

        def b(x, /, **kwargs):
            pass

        def c(x, *args, **kwargs):
            return g(*args, **kwargs)

        def d(x, *, y, **options):
            return g(x, y=y, **options)

        def e(
            x,
            **kwargs
        ):
            return x
        """, """\
        def a():
            pass

        def b(x, /):
            pass

        def c(x, *args):
            return g(*args)

        def d(x, *, y):
            return g(x, y=y)

        def e(
            x
        ):
            return x
        """)


def test_forwarding_inside_a_comprehension_is_forwarding() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        def f(xs, **kwargs):
            return [g(x, **kwargs) for x in xs], {k: g(k, **kwargs) for k in xs}
        """, """\
        def f(xs):
            return [g(x) for x in xs], {k: g(k) for k in xs}
        """)


def test_a_nested_function_with_its_own_kwargs_is_decided_on_its_own() -> None:
    # Both only forward: both go, and the outer call of the inner function loses its argument.
    assert_rewrites(DropForwardedKwargs, """\
        def outer(x, **kwargs):
            def inner(y, **kwargs):
                return g(y, **kwargs)
            return inner(x, **kwargs)
        """, """\
        def outer(x):
            def inner(y):
                return g(y)
            return inner(x)
        """)
    # The inner one reads its own: it stays (reported), the outer one still goes.
    code = """\
        def outer(x, **kwargs):
            def inner(y, **kwargs):
                return kwargs.get("scale", y)
            return inner(x, **kwargs)
        """
    assert_rewrites(DropForwardedKwargs, code, """\
        def outer(x):
            def inner(y, **kwargs):
                return kwargs.get("scale", y)
            return inner(x)
        """)
    warnings = warnings_of(code)
    assert len(warnings) == 1 and "**kwargs of outer.inner kept: used other than as a `**kwargs` argument" \
        in warnings[0], warnings


def test_a_method_whose_callers_pass_only_its_named_parameters_loses_kwargs() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        class Model:
            def helper(self, x, scale=1, **kwargs):
                return g(x, **kwargs)

            def forward(self, x, **kwargs):
                return self.helper(x, scale=2, **kwargs)
        """, """\
        class Model:
            def helper(self, x, scale=1):
                return g(x)

            def forward(self, x):
                return self.helper(x, scale=2)
        """)


def test_only_annotated_parameters_with_the_annotations_option() -> None:
    code = """\
        import torch
        from transformers.processing_utils import Unpack
        from transformers.utils import TransformersKwargs as Options

        def f(x, **kwargs: Unpack[Options]):
            return g(x, **kwargs)

        def h(x, **kwargs):
            return g(x, **kwargs)

        def k(x, **kwargs: dict):
            return g(x, **kwargs)
        """
    assert_rewrites(DropForwardedKwargs, code, """\
        import torch

        def f(x):
            return g(x)

        def h(x, **kwargs):
            return g(x, **kwargs)

        def k(x, **kwargs: dict):
            return g(x, **kwargs)
        """, annotations=KWARGS_ANNOTATIONS)
    assert warnings_of(code, annotations=KWARGS_ANNOTATIONS) == []  # not asked for: left without a word
    assert_rewrites(DropForwardedKwargs, code, """\
        import torch

        def f(x):
            return g(x)

        def h(x):
            return g(x)

        def k(x):
            return g(x)
        """)


def test_annotations_option_is_validated() -> None:
    assert parse_options(ForwardedKwargsOptions, {}).annotations == ()
    assert parse_options(ForwardedKwargsOptions, {"annotations": list(KWARGS_ANNOTATIONS)}).annotations \
        == KWARGS_ANNOTATIONS
    with pytest.raises(OptionError, match=re.escape("annotations[1]: 'typing.Unpack[X]' is not a qualified name")):
        parse_options(ForwardedKwargsOptions, {"annotations": ["typing.Unpack", "typing.Unpack[X]"]})
    with pytest.raises(OptionError, match="annotations: expected a list"):
        parse_options(ForwardedKwargsOptions, {"annotations": "typing.Unpack"})
    with pytest.raises(OptionError, match="annotation: unknown key"):
        parse_options(ForwardedKwargsOptions, {"annotation": ["typing.Unpack"]})


def test_discarded_pops_of_named_keys_go_with_the_parameter() -> None:
    """GPT-2 5.x's model forward pops the output flags before it passes the rest on."""
    before = """\
        def forward(self, x, **kwargs):
            kwargs.pop("output_attentions", None)
            kwargs.pop("output_hidden_states", None)
            return self.block(x, **kwargs)
        """
    after = """\
        def forward(self, x):
            return self.block(x)
        """
    assert_rewrites(DropForwardedKwargs, before, after)
    kept = before.replace("return self.block(x, **kwargs)", "return self.block(x, kwargs)")
    assert_unchanged(DropForwardedKwargs, kept)  # another use keeps the parameter and its pops


def test_kwargs_passed_whole_as_a_keyword_value_become_the_empty_dict() -> None:
    """5.24's attention hands its options to the cache's update as one dict (``kwargs=kwargs``)."""
    assert_rewrites(DropForwardedKwargs, """\
        def forward(self, x, cache=None, **kwargs):
            if cache is not None:
                x = cache.update(x, self.layer_idx, kwargs=kwargs)
            return self.attn(x, **kwargs)
        """, """\
        def forward(self, x, cache=None):
            if cache is not None:
                x = cache.update(x, self.layer_idx, kwargs={})
            return self.attn(x)
        """)


# --- kept, with a warning naming the cause ----------------------------------------------------------------

@pytest.mark.parametrize("body", [
    'return g(x, scale=kwargs.get("scale", 1.0), **kwargs)',
    'return g(x, kwargs["scale"])',
    "return g(x, kwargs)",
    "return g(x, *kwargs)",
    "return g(x, **{**kwargs})",
    "return kwargs",
    "class Inner(Base, **kwargs): pass",
    "inner = lambda y: g(y, **kwargs)",
    'return g(x, kwargs.pop("scale", 1.0), **kwargs)',  # a pop whose value is used reads kwargs
    "kwargs.pop(key)",  # a key that is not a literal
])
def test_other_uses_keep_kwargs(body: str) -> None:
    assert_kept(f"def f(x, **kwargs):\n    {body}\n", "line 2: **kwargs of f kept: ")


def test_a_read_in_a_plain_expression_is_reported_as_such() -> None:
    assert_kept("def f(x, **kwargs):\n    return g(x, kwargs)\n",
                "**kwargs of f kept: used other than as a `**kwargs` argument")


def test_a_nested_function_closing_over_kwargs_keeps_them() -> None:
    assert_kept("""\
        def f(x, **kwargs):
            def inner(y):
                return g(y, **kwargs)
            return inner(x)
        """, "line 3: **kwargs of f kept: a nested function, lambda or class body uses it")


def test_a_nonlocal_declaration_keeps_kwargs() -> None:
    assert_kept("""\
        def f(x, **kwargs):
            def inner():
                nonlocal kwargs
                kwargs = {}
            inner()
            return g(x, **kwargs)
        """, "**kwargs of f kept: a nested scope declares it nonlocal")


@pytest.mark.parametrize("rebinding", ["kwargs = {}", "kwargs |= {}", "del kwargs", "for kwargs in ({},): pass",
                                       "import kwargs", "def kwargs(): pass"])
def test_rebinding_keeps_kwargs(rebinding: str) -> None:
    assert_kept(f"def f(x, **kwargs):\n    {rebinding}\n    return g(x, **kwargs)\n",
                "line 2: **kwargs of f kept: `kwargs` is rebound in the function")


@pytest.mark.parametrize("call", ["locals()", "vars()", 'eval("kwargs")', 'exec("y = kwargs")'])
def test_dynamic_access_keeps_kwargs(call: str) -> None:
    assert_kept(f"def f(x, **kwargs):\n    y = {call}\n    return g(x, **kwargs)\n",
                f"line 2: **kwargs of f kept: `{call.partition('(')[0]}` may read it")


def test_a_local_named_like_a_builtin_is_not_dynamic_access() -> None:
    assert_rewrites(DropForwardedKwargs, """\
        def locals():
            return {}

        def f(x, **kwargs):
            return g(locals(), x, **kwargs)
        """, """\
        def locals():
            return {}

        def f(x):
            return g(locals(), x)
        """)


def test_a_caller_passing_a_keyword_only_kwargs_takes_keeps_them() -> None:
    assert_kept("""\
        class Layer:
            def forward(self, x, **kwargs):
                return g(x, **kwargs)

        class Model:
            def __init__(self):
                self.layer = Layer()

            def forward(self, x):
                return self.layer(x, use_cache=False)
        """, "line 10: **kwargs of Layer.forward kept: this call passes `use_cache=`, which only `**kwargs` takes")


def test_a_kept_caller_keeps_what_it_forwards_to_to_a_fixed_point() -> None:
    code = """\
        def top(x, **kwargs):
            kwargs.setdefault("debug", False)
            return middle(x, **kwargs)

        def middle(x, **kwargs):
            return bottom(x, **kwargs)

        def bottom(x, **kwargs):
            return g(x, **kwargs)
        """
    assert_unchanged(DropForwardedKwargs, code)
    assert warnings_of(code) == [
        "line 2: **kwargs of top kept: used other than as a `**kwargs` argument",
        "line 3: **kwargs of middle kept: this call passes `**kwargs`, which may hold any keyword",
        "line 6: **kwargs of bottom kept: this call passes `**kwargs`, which may hold any keyword",
    ]


def test_keep_names_one_method_as_class_dot_method() -> None:
    # BERT 5.x: `self.self` is a self- or cross-attention picked in __init__; only the cross-attention names
    # the keywords the call passes, the self-attention takes them in its **kwargs.
    assert_rewrites(DropForwardedKwargs, """\
        class SelfAttention:
            def forward(self, x, **kwargs):
                return attend(x, **kwargs)

        class Output:
            def forward(self, x, **kwargs):
                return self.dense(x, **kwargs)
        """, """\
        class SelfAttention:
            def forward(self, x, **kwargs):
                return attend(x, **kwargs)

        class Output:
            def forward(self, x):
                return self.dense(x)
        """, keep=("SelfAttention.forward",))


def test_nothing_to_do() -> None:
    assert_unchanged(DropForwardedKwargs, "def f(x, *args):\n    return g(x, *args)\n")
    assert_unchanged(DropForwardedKwargs, "f = lambda x, **kwargs: g(x, **kwargs)\n")  # lambdas are left alone


# --- the real thing ---------------------------------------------------------------------------------------

def test_transformers_5_t5_loses_every_kwargs() -> None:
    source = REPO / ".venv/transformers/5.23.0" / T5_MEMBER
    assert source.is_file(), "run bash scripts/setup.sh (installs every release side by side)"
    code = source.read_text(encoding="utf-8")
    assert code.count("**kwargs") == 27  # twelve parameters, fifteen arguments
    context = CodemodContext(full_module_name=MODULE, full_package_name=MODULE.rpartition(".")[0])
    result = DropForwardedKwargs(context).transform_module(cst.parse_module(code)).code
    assert context.warnings == []
    assert "**kwargs" not in result and "TransformersKwargs" not in result and "Unpack" not in result
    compile(result, "modeling_t5.py", "exec", dont_inherit=True)
    context = CodemodContext(full_module_name=MODULE, full_package_name=MODULE.rpartition(".")[0])
    assert DropForwardedKwargs(context).transform_module(cst.parse_module(result)).code == result
