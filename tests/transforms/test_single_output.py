from typing import Any

import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from common.schema import OptionError
from transforms.library.base import TransformError
from transforms.single_output import SingleOutput

RETURNS: dict[str, Any] = {"returns": {"LM": "loss if labels is not None else logits", "Encoder": "outputs[0]"}}


def test_every_return_of_forward_becomes_the_recipe_value() -> None:
    assert_rewrites(SingleOutput, """\
        class LM(Base):
            def forward(self, x, labels=None, return_dict=None):
                logits = self.head(x)
                loss = None
                if not return_dict:
                    return ((loss,) + (logits,)) if loss is not None else (logits,)
                return Output(loss=loss, logits=logits)
        """, """\
        class LM(Base):
            def forward(self, x, labels=None, return_dict=None):
                logits = self.head(x)
                loss = None
                if not return_dict:
                    return loss if labels is not None else logits
                return loss if labels is not None else logits
        """, **RETURNS)


def test_only_the_named_classes_and_method_change() -> None:
    assert_unchanged(SingleOutput, """\
        class Other(Base):
            def forward(self, x):
                return x, x

        class Encoder(Base):
            def helper(self, outputs):
                return outputs
        """, **RETURNS)


def test_nested_function_returns_are_their_own() -> None:
    assert_rewrites(SingleOutput, """\
        class Encoder(Base):
            def forward(self, x):
                def shape(t):
                    return t.view(-1)
                outputs = (shape(x),)
                return outputs
        """, """\
        class Encoder(Base):
            def forward(self, x):
                def shape(t):
                    return t.view(-1)
                outputs = (shape(x),)
                return outputs[0]
        """, **RETURNS)


def test_value_naming_unbound_names_is_a_recipe_error() -> None:
    with pytest.raises(ValueError, match="LM.forward does not bind labels"):
        run(SingleOutput, """\
            class LM(Base):
                def forward(self, x):
                    logits = x
                    loss = x
                    return logits
            """, **RETURNS)


ITEMS = {"returns": {"Base": "hidden_states", "Head": "loss if labels is not None else logits"},
         "items": {"Head": {"self.transformer": 0}}}


def test_a_caller_of_a_single_output_model_reads_the_value_itself() -> None:
    assert_rewrites(SingleOutput, """\
        class Base(Pre):
            def forward(self, x, return_dict=None):
                hidden_states = self.h(x)
                if not return_dict:
                    return tuple(v for v in [hidden_states, None] if v is not None)
                return Output(last_hidden_state=hidden_states)


        class Head(Pre):
            def forward(self, x, labels=None, return_dict=None):
                transformer_outputs = self.transformer(x, return_dict=return_dict)
                hidden_states = transformer_outputs[0]
                logits = self.lm_head(hidden_states) + self.transformer(x)[0]
                loss = None
                if not return_dict:
                    output = (logits,) + transformer_outputs[1:]
                    return ((loss,) + output) if loss is not None else output
                return Output(loss=loss, logits=logits, past=transformer_outputs.past_key_values)
        """, """\
        class Base(Pre):
            def forward(self, x, return_dict=None):
                hidden_states = self.h(x)
                if not return_dict:
                    return hidden_states
                return hidden_states


        class Head(Pre):
            def forward(self, x, labels=None, return_dict=None):
                transformer_outputs = self.transformer(x, return_dict=return_dict)
                hidden_states = transformer_outputs
                logits = self.lm_head(hidden_states) + self.transformer(x)
                loss = None
                if not return_dict:
                    return loss if labels is not None else logits
                return loss if labels is not None else logits
        """, **ITEMS)


@pytest.mark.parametrize("body,message", [
    ("outputs = self.transformer(x)\n        return outputs[0] + outputs[1]",
     "Head.forward reads outputs other than as item 0"),
    ("outputs = self.transformer(x)\n        return outputs[0] + outputs.past_key_values",
     "Head.forward reads outputs other than as item 0"),
    ("return self.other(x)[0]", "Head.forward has no call of self.transformer"),
])
def test_a_caller_that_needs_more_than_the_one_value_is_an_error(body: str, message: str) -> None:
    from transforms.library.base import TransformError
    code = f"""\
class Head(Pre):
    def forward(self, x):
        {body}
"""
    with pytest.raises(TransformError, match=message):
        run(SingleOutput, code, returns={}, items={"Head": {"self.transformer": 0}})


NESTED: dict[str, Any] = {"returns": {"Base": "seq", "Heads": "self.cls(seq, pooled)"},
          "nested": {"Base": {"returns": "(seq, pooled)", "callers": {"Heads": "self.bert"}}}}


def test_a_base_model_returns_more_to_the_callers_that_ask_for_it() -> None:
    assert_rewrites(SingleOutput, """\
        class Base(Pre):
            def forward(self, x, return_dict=None):
                seq = self.h(x)
                pooled = self.pool(seq)
                return Output(last_hidden_state=seq, pooler_output=pooled)


        class Heads(Pre):
            def forward(self, x, labels=None):
                outputs = self.bert(x)
                seq, pooled = outputs[:2]
                return Out(self.cls(seq, pooled))
        """, """\
        class Base(Pre):
            def forward(self, x, return_dict=None, return_tuple=None):
                seq = self.h(x)
                pooled = self.pool(seq)
                return (seq, pooled) if return_tuple else seq


        class Heads(Pre):
            def forward(self, x, labels=None):
                outputs = self.bert(x, return_tuple=True)
                seq, pooled = outputs[:2]
                return self.cls(seq, pooled)
        """, **NESTED)


def test_the_flag_is_keyword_only_after_star_args() -> None:
    result = run(SingleOutput, "class Base:\n    def forward(self, *args, x=None):\n        return Output(x)\n",
                 returns={"Base": "x"}, nested={"Base": {"returns": "(x, x)", "callers": {"Heads": "self.bert"}}})
    assert "def forward(self, *args, x=None, return_tuple=None):" in result
    assert "return (x, x) if return_tuple else x" in result


def test_a_caller_without_the_named_call_is_an_error() -> None:
    with pytest.raises(TransformError, match="Heads.forward has no call of self.bert"):
        run(SingleOutput, "class Heads:\n    def forward(self, x):\n        seq, pooled = self.roberta(x)\n"
                          "        return seq\n", **NESTED)


@pytest.mark.parametrize("options,message", [
    ({"returns": {}, "nested": {"Base": {"returns": "x", "callers": {"H": "self.b"}}}}, "no single value in returns"),
    ({"returns": {"Base": "x"}, "nested": {"Base": {"returns": "x", "callers": {}}}}, "name at least one calling"),
    ({"returns": {"Base": "x"}, "nested": {"Base": {"returns": "(x,", "callers": {"H": "self.b"}}}},
     "is not an expression"),
    ({"returns": {"Base": "x"}, "items": {"H": {"self.b": 0}},
      "nested": {"Base": {"returns": "x", "callers": {"H": "self.b"}}}}, "is read as one item"),
])
def test_nested_options_are_checked_at_load(options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        run(SingleOutput, "x = 1\n", **options)
