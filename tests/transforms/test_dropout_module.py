from __future__ import annotations

from functools import partial
from textwrap import dedent
from typing import Any

import libcst as cst
import pytest
import torch
from conftest import T5_SOURCE
from libcst.codemod import CodemodContext
from support import transform_helpers
from support.transform_helpers import MODULE, assert_rewrites, assert_unchanged, run
from torch import nn
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from transforms.dropout_module import DropoutModule

warnings_of = partial(transform_helpers.warnings_of, DropoutModule)
assert_left_with_warning = partial(transform_helpers.assert_left_with_warning, DropoutModule)


# --- rewrites ---------------------------------------------------------------------------------------------

def test_keyword_p_and_training() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, rate):
                super().__init__()
                self.rate = rate

            def forward(self, x):
                return F.dropout(x, p=self.rate, training=self.training)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, rate):
                super().__init__()
                self.rate = rate
                self.dropout = nn.Dropout(self.rate)

            def forward(self, x):
                return self.dropout(x)
        """)


def test_positional_p_and_training() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return F.dropout(x, 0.1, self.training)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.dropout = nn.Dropout(0.1)

            def forward(self, x):
                return self.dropout(x)
        """)


def test_missing_p_is_the_default_half() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return F.dropout(input=x, training=self.training)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.dropout = nn.Dropout(0.5)

            def forward(self, x):
                return self.dropout(x)
        """)


def test_inplace_is_passed_through() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return F.dropout(x, 0.1, self.training, True)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.dropout = nn.Dropout(0.1, inplace=True)

            def forward(self, x):
                return self.dropout(x)
        """)


ALIASES = [
    ("import torch.nn.functional as F\nfrom torch import nn\n", "nn.Module", "F.dropout"),
    ("from torch import nn\n", "nn.Module", "nn.functional.dropout"),
    ("import torch\nimport torch.nn as nn\n", "torch.nn.Module", "torch.nn.functional.dropout"),
    ("from torch.nn.functional import dropout as drop\nfrom torch import nn\n", "nn.Module", "drop"),
    ("from torch.nn import functional as fn\nimport torch.nn as nn\n", "nn.Module", "fn.dropout"),
]


@pytest.mark.parametrize(("imports", "base", "dropout"), ALIASES)
def test_any_spelling_of_functional_dropout(imports: str, base: str, dropout: str) -> None:
    head = f"class Block({base}):\n    def __init__(self):\n        super().__init__()\n"
    tail = "    def forward(self, x):\n        return {}\n"
    assert_rewrites(DropoutModule, imports + head + tail.format(f"{dropout}(x, p=0.1, training=self.training)"),
                    imports + head + "        self.dropout = nn.Dropout(0.1)\n" + tail.format("self.dropout(x)"))


def test_without_nn_in_scope_torch_is_spelled_out_and_imported() -> None:
    assert_rewrites(DropoutModule, """\
        from torch.nn import Module
        from torch.nn.functional import dropout

        class Block(Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return dropout(x, 0.1, training=self.training)
        """, """\
        from torch.nn import Module
        from torch.nn.functional import dropout
        import torch

        class Block(Module):
            def __init__(self):
                super().__init__()
                self.dropout = torch.nn.Dropout(0.1)

            def forward(self, x):
                return self.dropout(x)
        """)


def test_float_named_dropout_like_t5_attention_keeps_its_name() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout = config.dropout_rate
                self.o = nn.Linear(4, 4)

            def forward(self, x):
                w = F.dropout(
                    x, p=self.dropout, training=self.training
                )  # (batch, heads, query, key)
                return self.o(w)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout = config.dropout_rate
                self.o = nn.Linear(4, 4)
                self.dropout_module = nn.Dropout(self.dropout)

            def forward(self, x):
                w = self.dropout_module(
                    x
                )  # (batch, heads, query, key)
                return self.o(w)
        """)


def test_recipe_chooses_the_attribute_name() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout = config.dropout_rate

            def forward(self, x):
                return F.dropout(x, p=self.dropout, training=self.training)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout = config.dropout_rate
                self.attn_dropout = nn.Dropout(self.dropout)

            def forward(self, x):
                return self.attn_dropout(x)
        """, attribute="attn_dropout")


def test_names_used_by_bases_and_subclasses_in_the_file_are_avoided() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Base(nn.Module):
            def dropout(self, x):
                return x

        class Block(Base):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return F.dropout(x, 0.1, self.training)

        class Special(Block):
            def __init__(self):
                super().__init__()
                self.dropout_module = None
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Base(nn.Module):
            def dropout(self, x):
                return x

        class Block(Base):
            def __init__(self):
                super().__init__()
                self.dropout_module_1 = nn.Dropout(0.1)

            def forward(self, x):
                return self.dropout_module_1(x)

        class Special(Block):
            def __init__(self):
                super().__init__()
                self.dropout_module = None
        """)


def test_calls_with_the_same_p_share_one_module() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.rate = config.rate

            def forward(self, x):
                return F.dropout(x, self.rate, self.training) + F.dropout(x, p=self.rate, training=self.training)

            def attend(self, x):
                return F.dropout(x, p=self.rate, training=self.training, inplace=False)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.rate = config.rate
                self.dropout = nn.Dropout(self.rate)

            def forward(self, x):
                return self.dropout(x) + self.dropout(x)

            def attend(self, x):
                return self.dropout(x)
        """)


def test_different_p_get_different_modules() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config
                self.keep = config.keep

            def forward(self, x):
                x = F.dropout(x, self.config.attention_dropout, self.training)
                x = F.dropout(x, 1 - self.keep, self.training)
                return F.dropout(x, 1 - self.keep, self.training, inplace=True)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config
                self.keep = config.keep
                self.dropout = nn.Dropout(self.config.attention_dropout)
                self.dropout_module = nn.Dropout(1 - self.keep)
                self.dropout_module_1 = nn.Dropout(1 - self.keep, inplace=True)

            def forward(self, x):
                x = self.dropout(x)
                x = self.dropout_module(x)
                return self.dropout_module_1(x)
        """)


def test_instance_names_other_than_self() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(me, rate):
                super().__init__()
                me.rate = rate

            def forward(this, x):
                def inner(y):
                    return F.dropout(y, this.rate, this.training)
                return inner(x)
        """, """\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(me, rate):
                super().__init__()
                me.rate = rate
                me.dropout = nn.Dropout(me.rate)

            def forward(this, x):
                def inner(y):
                    return this.dropout(y)
                return inner(x)
        """)


def test_subclasses_of_relative_pretrained_model_and_local_modules_count() -> None:
    assert_rewrites(DropoutModule, """\
        import torch.nn.functional as F
        from torch import nn
        from ...modeling_utils import PreTrainedModel

        class Base(PreTrainedModel):
            pass

        class Model(Base):
            def __init__(self, config):
                super().__init__(config)

            def forward(self, x):
                return F.dropout(x, 0.1, self.training)
        """, """\
        import torch.nn.functional as F
        from torch import nn
        from ...modeling_utils import PreTrainedModel

        class Base(PreTrainedModel):
            pass

        class Model(Base):
            def __init__(self, config):
                super().__init__(config)
                self.dropout = nn.Dropout(0.1)

            def forward(self, x):
                return self.dropout(x)
        """)


def test_recipe_names_further_module_bases() -> None:
    code = """\
        import torch.nn.functional as F
        from torch import nn
        from mylib import Layer

        class Block(Layer):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return F.dropout(x, 0.1, self.training)
        """
    assert_left_with_warning(code, "Block is not a known nn.Module subclass")
    assert "self.dropout = nn.Dropout(0.1)" in run(DropoutModule, code, module_bases=("mylib.Layer",))


# --- calls left alone -------------------------------------------------------------------------------------

MODULE_CLASS = """\
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, rate):
            super().__init__()
            self.rate = rate
            if rate:
                self.maybe = rate

        def forward(self, x, flag, rate):
            return {call}

        def reset(self):
            self.changing = 0.2
    """


@pytest.mark.parametrize(("call", "expected"), [
    ("F.dropout(x, 0.1, False)", "line 12: training hard-coded to False"),
    ("F.dropout(x, p=0.1, training=True)", "line 12: training hard-coded to True"),
    ("F.dropout(x, 0.1)", "training hard-coded to True (the default)"),
    ("F.dropout(x, 0.1, training=flag)", "training=flag is not the instance's training flag"),
    ("F.dropout(x, rate, self.training)", "p and inplace must be constants or attributes"),
    ("F.dropout(x, self.changing, self.training)", "p and inplace must be constants or attributes"),
    ("F.dropout(x, self.maybe, self.training)", "p and inplace must be constants or attributes"),
    ("F.dropout(x, 0.1, self.training, inplace=flag)", "p and inplace must be constants or attributes"),
    ("F.dropout(*x, training=self.training)", "dropout called with * or ** arguments"),
])
def test_calls_that_stay_functional_are_reported(call: str, expected: str) -> None:
    assert_left_with_warning(MODULE_CLASS.format(call=call), expected)


def test_class_without_init_is_reported() -> None:
    assert_left_with_warning("""\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def forward(self, x):
                return F.dropout(x, 0.1, self.training)
        """, "line 6: cannot add a submodule to Block: it has no __init__")


def test_dropout_inside_init_is_reported() -> None:
    assert_left_with_warning("""\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self, x):
                super().__init__()
                self.x = F.dropout(x, 0.1, self.training)
        """, "would run before its submodule exists")


def test_non_module_class_is_reported() -> None:
    assert_left_with_warning("""\
        import torch.nn.functional as F

        class Helper:
            def __init__(self):
                self.training = True

            def apply(self, x):
                return F.dropout(x, 0.1, self.training)
        """, "Helper is not a known nn.Module subclass")


def test_function_no_class_uses_is_left_with_a_warning() -> None:
    assert_left_with_warning("""\
        import torch.nn.functional as F

        def apply(self, x):
            return F.dropout(x, 0.1, self.training)
        """, "no class of the file uses apply")


ATTENTION_FUNCTION = """\
    from torch import nn

    def eager_attention_forward(module, query, key, dropout=0.0, **kwargs):
        weights = nn.functional.softmax(query @ key, dim=-1)
        weights = nn.functional.dropout(weights, p=dropout, training=module.training)
        return weights

    class SelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.dropout = config.attention_dropout

        def forward(self, query, key):
            attention_interface = eager_attention_forward
            return attention_interface(self, query, key, dropout=self.dropout)

    class CrossAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.dropout_module = nn.Identity()

        def forward(self, query, key):
            return eager_attention_forward(self, query, key, dropout=0.1)
    """


def test_module_level_function_reads_a_submodule_every_caller_owns() -> None:
    # CrossAttention uses "dropout_module" already: both callers get the first name free in each.
    assert_rewrites(DropoutModule, ATTENTION_FUNCTION, """\
        from torch import nn
        import stateless

        def eager_attention_forward(module, query, key, dropout=0.0, **kwargs):
            weights = nn.functional.softmax(query @ key, dim=-1)
            weights = module.dropout_module_1(weights, dropout)
            return weights

        class SelfAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout = config.attention_dropout
                self.dropout_module_1 = stateless.FunctionalDropout()

            def forward(self, query, key):
                attention_interface = eager_attention_forward
                return attention_interface(self, query, key, dropout=self.dropout)

        class CrossAttention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.dropout_module = nn.Identity()
                self.dropout_module_1 = stateless.FunctionalDropout()

            def forward(self, query, key):
                return eager_attention_forward(self, query, key, dropout=0.1)
        """)
    assert warnings_of(ATTENTION_FUNCTION) == []


def test_module_level_function_used_outside_a_module_class_stays_functional() -> None:
    assert_left_with_warning(ATTENTION_FUNCTION + """\

    registry = {"eager": eager_attention_forward}
    """, "used outside the file's classes")
    assert_left_with_warning(ATTENTION_FUNCTION + """\

    class Helper:
        def run(self, module, q, k):
            return eager_attention_forward(module, q, k)
    """, "Helper uses it and is not a known nn.Module subclass")


def test_module_level_function_refusals_name_the_function() -> None:
    assert_left_with_warning("""\
        from torch import nn

        def attend(module, w, flag):
            return nn.functional.dropout(w, p=0.1, training=flag)

        class A(nn.Module):
            def forward(self, w):
                return attend(self, w, self.training)
        """, "training=flag is not the training flag of a module the function is given; functional dropout in attend")
    assert_left_with_warning("""\
        from torch import nn

        def attend(module, w):
            return nn.functional.dropout(w, 0.1, module.training, True)

        class A(nn.Module):
            def forward(self, w):
                return attend(self, w)
        """, "in-place dropout")


def test_module_level_function_rewrite_is_idempotent_and_equal() -> None:
    once = run(DropoutModule, ATTENTION_FUNCTION)
    assert_unchanged(DropoutModule, once)
    namespace: dict[str, Any] = {}
    exec(compile(once, "<generated>", "exec"), namespace)  # noqa: S102  # the code the test just generated
    config = type("Config", (), {"attention_dropout": 0.3})()
    module = namespace["SelfAttention"](config)
    query, key = torch.randn(2, 3, 4), torch.randn(2, 4, 3)
    for train in (True, False):
        module.train(train)
        torch.manual_seed(0)
        expected = nn.functional.dropout(torch.softmax(query @ key, dim=-1), 0.3, train)
        torch.manual_seed(0)
        assert torch.equal(module(query, key), expected)
    traced = torch.fx.symbolic_trace(module.eval())
    assert all(node.target is not nn.functional.dropout for node in traced.graph.nodes), traced.graph
    traced.train()
    torch.manual_seed(1)
    first = traced(query, key)
    assert not torch.equal(first, traced(query, key)), "the traced graph does not follow .train()"


def test_dropout_modules_already_in_use_are_left_alone() -> None:
    code = """\
        from torch import nn

        class Block(nn.Module):
            def __init__(self, rate):
                super().__init__()
                self.dropout = nn.Dropout(rate)

            def forward(self, x):
                return self.dropout(x)
        """
    assert_unchanged(DropoutModule, code)
    assert warnings_of(code) == []


def test_other_functions_named_dropout_are_left_alone() -> None:
    assert_unchanged(DropoutModule, """\
        import torch
        from torch import nn
        from mylib import dropout

        class Block(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return dropout(x, 0.1, self.training) + torch.dropout(x, 0.1, self.training)
        """)


def test_strings_and_comments_are_left_alone() -> None:
    assert_unchanged(DropoutModule, '''\
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            """Applies F.dropout(x, p=0.1, training=self.training)."""

            def __init__(self):
                super().__init__()

            def forward(self, x):
                # F.dropout(x, p=0.1, training=self.training)
                return "F.dropout(x, p=0.1, training=self.training)"
        ''')


# --- runtime: same numbers, and tracing now follows train()/eval() ---------------------------------------

RUNTIME_SOURCE = """\
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, width, rate):
            super().__init__()
            self.proj = nn.Linear(width, width)
            self.dropout = rate

        def forward(self, x):
            h = F.dropout(self.proj(x), p=self.dropout, training=self.training)
            return h * F.dropout(x, self.dropout, self.training)

    class Head(nn.Module):
        def __init__(self, rate):
            super().__init__()
            self.rate = rate

        def forward(self, x):
            return F.dropout(x, self.rate, training=self.training)
    """


def build(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<generated>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def classes() -> tuple[dict[str, Any], dict[str, Any]]:
    before = dedent(RUNTIME_SOURCE)
    return build(before), build(run(DropoutModule, before))


def test_generated_source_uses_submodules(classes: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, after = classes
    assert isinstance(after["Attention"](4, 0.3).dropout_module, nn.Dropout)
    assert isinstance(after["Head"](0.3).dropout, nn.Dropout)


def test_same_outputs_and_gradients_in_eval_and_seeded_train(classes: tuple[dict[str, Any], ...]) -> None:
    before, after = classes
    original = before["Attention"](16, 0.3)
    rewritten = after["Attention"](16, 0.3)
    rewritten.load_state_dict(original.state_dict())  # strict: the state-dict keys are the same
    x = torch.randn(8, 16)
    original.eval()
    rewritten.eval()
    assert torch.equal(original(x), rewritten(x))

    results = []
    for model in (original, rewritten):
        model.train()
        model.zero_grad()
        torch.manual_seed(1234)
        inputs = x.clone().requires_grad_()
        out = model(inputs)
        out.sum().backward()
        results.append((out, inputs.grad, model.proj.weight.grad, model.proj.bias.grad))
    assert not torch.equal(results[0][0], original.eval()(x))  # dropout really ran
    for got, expected in zip(results[1], results[0]):
        assert torch.equal(got, expected)


def test_traced_rewrite_follows_train_and_eval_unlike_the_original(classes: tuple[dict[str, Any], ...]) -> None:
    before, after = classes
    rate = 0.3
    x = torch.rand(200, 200) + 1.0  # no zeros of its own
    rewritten = torch.fx.symbolic_trace(after["Head"](rate).eval())
    rewritten.train()
    dropped = rewritten(x)
    zeros = (dropped == 0).float().mean().item()
    assert abs(zeros - rate) < 0.02
    kept = dropped != 0
    assert torch.allclose(dropped[kept], x[kept] / (1 - rate))
    rewritten.eval()
    assert torch.equal(rewritten(x), x)

    original = torch.fx.symbolic_trace(before["Head"](rate).eval())
    original.train()
    assert torch.equal(original(x), x)  # training=self.training was frozen to False while tracing


# --- the real T5 source -----------------------------------------------------------------------------------

T5_CALL_BEFORE = """\
        attn_weights = F.dropout(
            attn_weights, p=self.dropout, training=self.training
        )  # (batch_size, n_heads, seq_length, key_length)
"""
T5_CALL_AFTER = """\
        attn_weights = self.dropout_module(
            attn_weights
        )  # (batch_size, n_heads, seq_length, key_length)
"""
T5_INIT_END = """\
        self.pruned_heads = set()
"""
T5_NEW_LINE = """\
        self.dropout_module = nn.Dropout(self.dropout)
"""


def test_t5_attention_gets_a_dropout_module() -> None:
    source = T5_SOURCE.read_text()
    context = CodemodContext(full_module_name=MODULE, full_package_name=MODULE.rpartition(".")[0])
    result = DropoutModule(context).transform_module(cst.parse_module(source)).code
    assert context.warnings == []
    assert source.count(T5_CALL_BEFORE) == 1 and source.count(T5_INIT_END) == 1
    assert result == source.replace(T5_CALL_BEFORE, T5_CALL_AFTER).replace(T5_INIT_END, T5_INIT_END + T5_NEW_LINE)
    compile(result, "modeling_t5.py", "exec")

    # The converted file still builds T5Attention, now with a dropout submodule beside its float rate.
    namespace: dict[str, Any] = {"__name__": "transformers.models.t5.modeling_t5_converted",
                                 "__package__": "transformers.models.t5"}
    exec(compile(result, "modeling_t5.py", "exec"), namespace)
    config = T5Config(d_model=16, d_kv=4, num_heads=2, dropout_rate=0.25)
    original = T5Attention(config, has_relative_attention_bias=True)
    converted = namespace["T5Attention"](config, has_relative_attention_bias=True)
    converted.load_state_dict(original.state_dict())
    assert converted.dropout == 0.25 and converted.dropout_module.p == 0.25
    hidden = torch.randn(2, 5, 16)
    outputs = []
    for model in (original.train(), converted.train()):
        torch.manual_seed(0)
        outputs.append(model(hidden)[0])
    assert torch.equal(outputs[0], outputs[1])
