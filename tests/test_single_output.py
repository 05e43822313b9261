import pytest

from transform_helpers import assert_rewrites, assert_unchanged, run
from transforms.single_output import SingleOutput

RETURNS = {"returns": {"LM": "loss if labels is not None else logits", "Encoder": "outputs[0]"}}


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
