"""The layer_drop transform: LayerDrop's Python draw and branch -> a LayerDrop submodule and unless_dropped."""

from __future__ import annotations

from functools import partial
from textwrap import dedent, indent

import pytest
from support import transform_helpers
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.layer_drop import LayerDropLoop

HEAD = """\
import math
import random

from torch import nn


class Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layerdrop = config.layerdrop
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, hidden_states, attention_mask):
        for idx, layer in enumerate(self.layers):
"""

AFTER_HEAD = HEAD.replace("import random\n", "").replace("from torch import nn\n", "from torch import nn\nimport stateless\n") \
    .replace("range(2)])\n", "range(2)])\n        self.layer_drop = stateless.LayerDrop()\n")


def loop(body: str) -> str:
    return HEAD + indent(dedent(body), " " * 12) + "        return hidden_states * math.e\n"


def rewritten(body: str) -> str:
    return AFTER_HEAD + indent(dedent(body), " " * 12) + "        return hidden_states * math.e\n"


warnings_of = partial(transform_helpers.warnings_of, LayerDropLoop)


def test_continue_form_becomes_a_decision_and_a_local_layer_function() -> None:
    assert_rewrites(LayerDropLoop, loop("""\
        # add LayerDrop (see https://arxiv.org/abs/1909.11556 for description)
        dropout_probability = random.uniform(0, 1)
        if self.training and (dropout_probability < self.layerdrop):
            continue

        layer_outputs = layer(hidden_states, attention_mask)
        hidden_states = layer_outputs[0]
        """), rewritten("""\
        # add LayerDrop (see https://arxiv.org/abs/1909.11556 for description)
        dropped = self.layer_drop(self.layerdrop, hidden_states)

        def run_layer(hidden_states):
            layer_outputs = layer(hidden_states, attention_mask)
            hidden_states = layer_outputs[0]
            return hidden_states

        hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
        """))


def test_else_form_with_a_skipping_assignment_nobody_reads_later() -> None:
    # BART's encoder: `layer_outputs = (None, None)` when skipped; only the layer's code reads layer_outputs.
    assert_rewrites(LayerDropLoop, loop("""\
        dropout_probability = random.random()
        if self.training and (self.layerdrop > dropout_probability):
            layer_outputs = (None, None)
        else:
            layer_outputs = layer(hidden_states, attention_mask)
            hidden_states = layer_outputs[0]
        """), rewritten("""\
        dropped = self.layer_drop(self.layerdrop, hidden_states)

        def run_layer(hidden_states):
            layer_outputs = layer(hidden_states, attention_mask)
            hidden_states = layer_outputs[0]
            return hidden_states

        hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
        """))


def test_names_already_taken_get_fresh_ones_and_random_stays_when_still_used() -> None:
    code = loop("""\
        dropped = random.random() * 0
        run_layer = None
        dropout_probability = random.uniform(0, 1)
        if self.training and (dropout_probability < self.layerdrop):
            continue
        hidden_states = layer(hidden_states) + dropped
        """)
    result = run(LayerDropLoop, code)
    assert "import random\n" in result  # the other draw still needs it
    assert "dropped_1 = self.layer_drop(self.layerdrop, hidden_states)" in result
    assert "def run_layer_1(hidden_states):" in result
    assert "hidden_states = stateless.unless_dropped(dropped_1, run_layer_1, hidden_states)" in result
    assert run(LayerDropLoop, result) == result


@pytest.mark.parametrize("body,problem", [
    ("""\
     dropout_probability = random.uniform(0, 1)
     if dropout_probability < self.layerdrop:
         continue
     hidden_states = layer(hidden_states)
     """, "is not `self.training and (dropout_probability < p)`"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     hidden_states = layer(hidden_states)
     """, "no `if <self>.training and ...` follows"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < self.layerdrop):
         continue
     hidden_states = layer(hidden_states) * dropout_probability
     """, "`dropout_probability` is read elsewhere too"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < self.layerdrop):
         continue
     hidden_states = layer(hidden_states)
     attention_mask = attention_mask + 1
     """, "the layer's code reads attention_mask before setting it"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < self.layerdrop):
         continue
     layer_outputs = layer(hidden_states)
     hidden_states = layer_outputs[0]
     math = layer_outputs[1]
     """, "carry exactly one variable to the code after it, not hidden_states, math"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < self.layerdrop):
         continue
     hidden_states = layer(hidden_states)
     if hidden_states is None:
         break
     """, "returns, yields, breaks, continues"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < self.layerdrop):
         print("skipped")
     else:
         hidden_states = layer(hidden_states)
     """, "the skipping branch does more than assign values"),
    ("""\
     dropout_probability = random.uniform(0, 1)
     if self.training and (dropout_probability < next(self.probabilities)):
         continue
     hidden_states = layer(hidden_states)
     """, "may have effects"),
], ids=["no-training-check", "no-branch", "draw-read-later", "read-before-set", "two-carried", "break", "skip-has-effects",
        "impure-probability"])
def test_loops_that_do_not_fit_are_reported_and_left_as_is(body: str, problem: str) -> None:
    code = loop(body)
    assert_unchanged(LayerDropLoop, code)
    warnings = warnings_of(code)
    assert len(warnings) == 1 and problem in warnings[0], warnings


def test_a_class_that_is_not_a_module_is_reported() -> None:
    code = loop("""\
        dropout_probability = random.uniform(0, 1)
        if self.training and (dropout_probability < self.layerdrop):
            continue
        hidden_states = layer(hidden_states)
        """).replace("class Encoder(nn.Module):", "class Encoder:")
    assert_unchanged(LayerDropLoop, code)
    assert "Encoder is not a known nn.Module subclass" in warnings_of(code)[0]


@pytest.mark.parametrize("code", [
    "import random\n\n\ndef f():\n    return random.uniform(0, 1)\n",  # a draw outside a loop
    "import random\n\n\ndef f(xs):\n    for x in xs:\n        y = random.uniform(0, 2)\n    return y\n",  # not (0, 1)
    "def f(xs):\n    for x in xs:\n        x = x + 1\n    return xs\n",
])
def test_code_without_the_idiom_is_left_alone_silently(code: str) -> None:
    assert_unchanged(LayerDropLoop, code)
    assert warnings_of(code) == []


# HF 4.35 on: `torch.rand([])` drawn in training only; the class's LayerDrop then draws from torch.
TORCH_HEAD = HEAD.replace("import random\n", "import torch\n")
TORCH_AFTER_HEAD = TORCH_HEAD.replace("from torch import nn\n", "from torch import nn\nimport stateless\n") \
    .replace("range(2)])\n", "range(2)])\n        self.layer_drop = stateless.LayerDrop(\"torch\")\n")
TORCH_LAYER = """\
dropped = self.layer_drop(self.layerdrop, hidden_states)

def run_layer(hidden_states):
    layer_outputs = layer(hidden_states, attention_mask)
    hidden_states = layer_outputs[0]
    return hidden_states

hidden_states = stateless.unless_dropped(dropped, run_layer, hidden_states)
"""


def torch_loop(body: str) -> str:
    return TORCH_HEAD + indent(dedent(body), " " * 12) + "        return hidden_states * math.e\n"


def test_torch_draw_continue_form() -> None:
    # BART's decoder, 4.35 on.
    assert_rewrites(LayerDropLoop, torch_loop("""\
        # add LayerDrop (see https://arxiv.org/abs/1909.11556 for description)
        if self.training:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:
                continue

        layer_outputs = layer(hidden_states, attention_mask)
        hidden_states = layer_outputs[0]
        """), TORCH_AFTER_HEAD + indent("# add LayerDrop (see https://arxiv.org/abs/1909.11556 for description)\n"
                                        + TORCH_LAYER, " " * 12) + "        return hidden_states * math.e\n")


def test_torch_draw_flag_form() -> None:
    # BART's encoder, 4.35 on: a flag, then the layer in the else of `if to_drop:`.
    assert_rewrites(LayerDropLoop, torch_loop("""\
        to_drop = False
        if self.training:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:  # skip the layer
                to_drop = True

        if to_drop:
            layer_outputs = (None, None)
        else:
            layer_outputs = layer(hidden_states, attention_mask)
            hidden_states = layer_outputs[0]
        """), TORCH_AFTER_HEAD + indent(TORCH_LAYER, " " * 12) + "        return hidden_states * math.e\n")


@pytest.mark.parametrize("body", [
    """\
    if self.training:
        dropout_probability = torch.rand([2])
        if dropout_probability < self.layerdrop:
            continue
    hidden_states = layer(hidden_states)
    """,  # not one 0-d draw
    """\
    if self.training:
        dropout_probability = torch.rand([])
        if dropout_probability < self.layerdrop:
            hidden_states = hidden_states * 2
    hidden_states = layer(hidden_states)
    """,  # neither continue nor a flag
    """\
    to_drop = False
    if self.training:
        dropout_probability = torch.rand([])
        if dropout_probability < self.layerdrop:
            to_drop = True
    hidden_states = layer(hidden_states)
    """,  # the flag is never tested
], ids=["not-0d", "no-skip", "flag-unread"])
def test_other_torch_draws_are_left_alone(body: str) -> None:
    assert_unchanged(LayerDropLoop, torch_loop(body))


def test_a_torch_draw_read_later_is_reported() -> None:
    code = torch_loop("""\
        if self.training:
            dropout_probability = torch.rand([])
            if dropout_probability < self.layerdrop:
                continue
        hidden_states = layer(hidden_states) * dropout_probability
        """)
    assert_unchanged(LayerDropLoop, code)
    assert "`dropout_probability` is read elsewhere too" in warnings_of(code)[0]
