from functools import partial
from textwrap import dedent

import libcst as cst
import libcst.matchers as m
import pytest
import torch
from conftest import T5_SOURCE
from support import transform_helpers
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.hoist_modules import HoistModules

convert = partial(transform_helpers.run_reporting, HoistModules)


def test_loss_moves_to_the_end_of_init() -> None:
    assert_rewrites(HoistModules, """\
        from torch import nn
        from torch.nn import CrossEntropyLoss

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(2, 3)

            def forward(self, x, labels):
                logits = self.proj(x)
                loss_fct = CrossEntropyLoss(ignore_index=-100)
                return loss_fct(logits, labels)
        """, """\
        from torch import nn
        from torch.nn import CrossEntropyLoss

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(2, 3)
                self.loss_fct = CrossEntropyLoss(ignore_index=-100)

            def forward(self, x, labels):
                logits = self.proj(x)
                return self.loss_fct(logits, labels)
        """)


def test_every_later_use_reads_the_attribute() -> None:
    assert_rewrites(HoistModules, """\
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                act = nn.modules.activation.ReLU()
                y = act(x)
                f = lambda t: act(t)
                return [act(v) for v in (y, f(x))]
        """, """\
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = nn.modules.activation.ReLU()

            def forward(self, x):
                y = self.act(x)
                f = lambda t: self.act(t)
                return [self.act(v) for v in (y, f(x))]
        """)


def test_only_statement_of_a_block_leaves_pass_and_comments_move_along() -> None:
    assert_rewrites(HoistModules, """\
        from torch import nn

        class Model(nn.Module):
            def __init__(self, p):
                super().__init__()
                self.p = p

            def forward(self, x):
                if x is None:

                    # build the dropout
                    drop = nn.Dropout(self.p)  # same p as config
                return drop(x)
        """, """\
        from torch import nn

        class Model(nn.Module):
            def __init__(self, p):
                super().__init__()
                self.p = p
                # build the dropout
                self.drop = nn.Dropout(self.p)  # same p as config

            def forward(self, x):
                if x is None:
                    pass
                return self.drop(x)
        """)


def test_attribute_name_does_not_collide() -> None:
    assert_rewrites(HoistModules, """\
        from torch import nn

        class Model(nn.Module):
            loss_1 = None

            def __init__(self):
                super().__init__()
                self.loss = 0

            def forward(self, x):
                loss = nn.MSELoss()
                return loss(x, x)
        """, """\
        from torch import nn

        class Model(nn.Module):
            loss_1 = None

            def __init__(self):
                super().__init__()
                self.loss = 0
                self.loss_2 = nn.MSELoss()

            def forward(self, x):
                return self.loss_2(x, x)
        """)


def test_subclass_of_pretrained_model_through_a_relative_import() -> None:
    assert_rewrites(HoistModules, """\
        from torch.nn import MSELoss
        from ...modeling_utils import PreTrainedModel

        class Base(PreTrainedModel):
            pass

        class Model(Base):
            def __init__(self, config):
                super().__init__(config)
                self.init_weights()

            def forward(self, x):
                return MSELoss()(x, x) if x is None else self.fallback(x)

            def score(self, x):
                loss_fct = MSELoss(reduction="sum")
                return loss_fct(x, x)
        """, """\
        from torch.nn import MSELoss
        from ...modeling_utils import PreTrainedModel

        class Base(PreTrainedModel):
            pass

        class Model(Base):
            def __init__(self, config):
                super().__init__(config)
                self.init_weights()
                self.loss_fct = MSELoss(reduction="sum")

            def forward(self, x):
                return MSELoss()(x, x) if x is None else self.fallback(x)

            def score(self, x):
                return self.loss_fct(x, x)
        """, methods=["score"])


def test_modules_with_parameters_are_hoisted_with_a_warning() -> None:
    code = """\
        from torch import nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                proj = nn.Linear(4, 4)
                return proj(x)
        """
    result, warnings = convert(code)
    assert "self.proj = nn.Linear(4, 4)" in result
    assert warnings == ["line 8: `nn.Linear` may hold parameters or buffers: "
                                 "the state dict gains keys under `proj.`"]


@pytest.mark.parametrize(("forward", "warning"), [
    ("loss = nn.MSELoss(reduction=mode)\n        return loss(x, x)", "line 8: module not hoisted: argument `mode`"),
    ("loss = nn.MSELoss(reduction=self.mode)\n        return loss(x, x)",
     "line 8: module not hoisted: argument `self.mode`"),
    ("loss = nn.MSELoss()\n        loss = loss(x, x)\n        return loss",
     "line 8: module not hoisted: `loss` is assigned more than once"),
    ("for v in x:\n            if v:\n                y = loss(x, x)\n"
     "            loss = nn.MSELoss()\n        return y",
     "line 11: module not hoisted: `loss` is used before it is assigned"),
    ("y = [nn.ReLU()][0](x)\n        return y", "line 8: module built inside an expression"),
    ("y = nn.Softmax(dim=mode)(x)\n        return y", "line 8: module not hoisted: argument `mode`"),
])
def test_left_with_a_warning(forward: str, warning: str) -> None:
    code = f"""\
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, mode="mean"):
        {forward}
"""
    result, warnings = convert(code)
    assert result == code
    assert len(warnings) == 1 and warnings[0].startswith(warning)


def test_class_without_init_is_left_with_a_warning() -> None:
    code = """\
        from torch import nn

        class Model(nn.Module):
            def forward(self, x):
                loss = nn.MSELoss()
                return loss(x, x)
        """
    assert convert(code) == (dedent(code), [
        "line 5: module not hoisted: the class has no __init__ with an indented body to move it to"])


@pytest.mark.parametrize("code", [
    # not an nn.Module subclass
    "from torch import nn\nclass Helper:\n    def __init__(self):\n        pass\n"
    "    def forward(self, x):\n        loss = nn.MSELoss()\n        return loss(x, x)\n",
    # functional calls and parameters are not modules
    "from torch import nn\nimport torch.nn.functional as F\nclass M(nn.Module):\n    def __init__(self):\n"
    "        super().__init__()\n    def forward(self, x):\n        y = F.relu(x)\n"
    "        w = nn.Parameter(x)\n        return y * w\n",
    # a local class that merely shares a torch name
    "from torch import nn\nclass MSELoss:\n    pass\nclass M(nn.Module):\n    def __init__(self):\n"
    "        super().__init__()\n    def forward(self, x):\n        loss = MSELoss()\n        return loss\n",
    # other methods are not looked at by default
    "from torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "    def helper(self, x):\n        loss = nn.MSELoss()\n        return loss(x, x)\n",
])
def test_left_alone(code: str) -> None:
    assert_unchanged(HoistModules, code)


def test_runtime_same_loss_same_state_dict_and_traces() -> None:
    code = dedent("""\
        from torch import nn
        from torch.nn import CrossEntropyLoss

        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(4, 5)

            def forward(self, x, labels):
                logits = self.proj(x)
                loss_fct = CrossEntropyLoss(ignore_index=-100)
                return loss_fct(logits.view(-1, 5), labels.view(-1))
        """)

    def build(source: str) -> torch.nn.Module:
        namespace: dict = {}
        exec(source, namespace)
        torch.manual_seed(0)
        return namespace["Tiny"]()

    before, after = build(code), build(run(HoistModules, code))
    assert list(before.state_dict()) == list(after.state_dict())
    after.load_state_dict(before.state_dict())
    x, labels = torch.randn(2, 3, 4), torch.tensor([[1, -100, 4], [0, 2, -100]])
    expected = before(x, labels)
    assert torch.equal(after(x, labels), expected)
    with pytest.raises(Exception, match="not installed as a submodule"):
        torch.fx.symbolic_trace(before)
    assert torch.equal(torch.fx.symbolic_trace(after)(x, labels), expected)


def test_t5_source() -> None:
    result, warnings = convert(T5_SOURCE.read_text())
    assert warnings == []
    compile(result, "modeling_t5.py", "exec")
    [model] = [s for s in cst.parse_module(result).body
               if m.matches(s, m.ClassDef(m.Name("T5ForConditionalGeneration")))]
    methods = {f.name.value: f for f in cst.ensure_type(model, cst.ClassDef).body.body if isinstance(f, cst.FunctionDef)}
    code = cst.Module([]).code_for_node
    assert code(methods["__init__"].body.body[-1]).strip() == "self.loss_fct = CrossEntropyLoss(ignore_index=-100)"
    forward = code(methods["forward"])
    assert "loss_fct = " not in forward
    assert "loss = self.loss_fct(lm_logits.view(-1, lm_logits.size(-1)), labels.view(-1))" in forward


def test_a_module_built_and_called_at_once_becomes_an_attribute_named_after_its_class() -> None:
    assert_rewrites(HoistModules, """\
        import torch.nn as nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.softmax_1 = None
                self.dim = -1

            def _attn(self, w):
                w = nn.Softmax(dim=-1)(w)
                return nn.LogSoftmax(dim=self.dim)(w) + nn.Softmax(dim=-1)(w)
        """, """\
        import torch.nn as nn

        class Attention(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.softmax_1 = None
                self.dim = -1
                self.softmax = nn.Softmax(dim=-1)
                self.log_softmax = nn.LogSoftmax(dim=self.dim)
                self.softmax_2 = nn.Softmax(dim=-1)

            def _attn(self, w):
                w = self.softmax(w)
                return self.log_softmax(w) + self.softmax_2(w)
        """, methods=["_attn"])


def test_a_loss_built_in_each_branch_gets_an_attribute_per_class() -> None:
    before = """\
        from torch import nn
        from torch.nn import CrossEntropyLoss, MSELoss

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x, labels):
                if self.regression:
                    loss_fct = MSELoss()
                    loss = loss_fct(x, labels)
                else:
                    loss_fct = CrossEntropyLoss()
                    loss = loss_fct(x, labels)
                return loss
        """
    after = """\
        from torch import nn
        from torch.nn import CrossEntropyLoss, MSELoss

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.mse_loss = MSELoss()
                self.cross_entropy_loss = CrossEntropyLoss()

            def forward(self, x, labels):
                if self.regression:
                    loss = self.mse_loss(x, labels)
                else:
                    loss = self.cross_entropy_loss(x, labels)
                return loss
        """
    assert_rewrites(HoistModules, before, after)
    assert_unchanged(HoistModules, after)


def test_a_read_reached_by_two_bindings_is_not_hoisted() -> None:
    code = """\
        from torch import nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                if x is None:
                    loss = nn.MSELoss()
                else:
                    loss = nn.L1Loss()
                return loss(x, x)
        """
    result, warnings = convert(code)
    assert "self." not in result.split("def forward")[1]
    assert all("assigned more than once" in warning for warning in warnings) and len(warnings) == 2
